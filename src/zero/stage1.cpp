// Stage 1: fp32 master weights and optimizer state sharded over ranks; every rank keeps whole 16-bit parameters
// and gradients, and at the accumulation boundary each gradient bucket is reduce-scattered to its owners.
#include "dscpp/zero/in_flight.h"
#include "dscpp/zero/sharded_master.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {
namespace {

class Stage1 final : public ZeroStage {
 public:
  explicit Stage1(const StageContext& context)
      : flat_(*context.flat), master_(context, flat_.layout(), flat_.partition(context.comm->rank())) {
    flat_.attach_grad_buffer();
  }

  int stage() const override { return 1; }

  void before_backward() override { flat_.keep_grads_attached(); }
  void after_backward() override { flat_.check_grads_attached(); }

  void reduce_gradients() override {
    const auto& groups = flat_.layout().groups();
    InFlight in_flight(kMaxCollectivesInFlight);
    for (size_t g = 0; g < groups.size(); ++g) {
      in_flight.push(master_.reduce_group(static_cast<int>(g), flat_.grads().narrow(0, groups[g].offset, groups[g].numel)));
    }
    in_flight.drain();
    master_.prepare_master_grads();
  }

  const FlatLayout& layout() const override { return flat_.layout(); }
  torch::Tensor& master_params() override { return master_.params(); }
  void release_master() override { master_.release_master(); }
  torch::Tensor& master_grads() override { return master_.master_grads(); }
  torch::Tensor local_grad_sq_norm() override { return master_.local_grad_sq_norm(); }
  void publish_params() override { master_.publish(flat_); }
  void publish_range(int64_t begin, const torch::Tensor& values) override {
    master_.publish_range(flat_, begin, values);
  }
  void finish_publish() override { master_.finish_publish(); }

  void zero_grads() override {
    flat_.zero_grads();
    master_.zero_grads();
  }

  void visit_params(const ParamVisitor& fn) override { flat_.visit(fn); }

  StageMemory memory() const override {
    StageMemory m;
    m.params16 = flat_.params().nbytes();
    m.grads16 = flat_.grads().nbytes();
    m.master = master_.master_bytes();
    m.buffers = master_.shard_bytes() + master_.master_grad_bytes();
    return m;
  }

 private:
  FlatParams& flat_;
  ShardedMaster master_;
};

}  // namespace

std::unique_ptr<ZeroStage> make_stage1(const StageContext& context) { return std::make_unique<Stage1>(context); }

}  // namespace dscpp
