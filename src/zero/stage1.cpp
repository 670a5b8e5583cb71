// Stage 1: fp32 master weights and optimizer state sharded over ranks; every rank keeps whole 16-bit parameters
// and gradients, and at the accumulation boundary each gradient bucket is reduce-scattered to its owners.
#include "dscpp/zero/in_flight.h"
#include "sharded_flat_stage.h"

namespace dscpp {
namespace {

class Stage1 final : public ShardedFlatStage {
 public:
  explicit Stage1(const StageContext& context) : ShardedFlatStage(context) { flat_.attach_grad_buffer(); }

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

  void zero_grads() override {
    flat_.zero_grads();
    master_.zero_grads();
  }

  StageMemory memory() const override {
    StageMemory m;
    m.params16 = flat_.params().nbytes();
    m.grads16 = flat_.grads().nbytes();
    m.master = master_.master_bytes();
    m.buffers = master_.shard_bytes() + master_.master_grad_bytes();
    return m;
  }
};

}  // namespace

std::unique_ptr<ZeroStage> make_stage1(const StageContext& context) { return std::make_unique<Stage1>(context); }

}  // namespace dscpp
