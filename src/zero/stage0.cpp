// Stage 0: plain data parallel — full master weights and optimizer state on every rank, gradients all-reduced
// in buckets of reduce_bucket_size at the accumulation boundary. In fp32 the master is the model's own flat buffer.
#include <algorithm>

#include "dscpp/zero/zero_stage.h"

namespace dscpp {
namespace {

class Stage0 final : public ZeroStage {
 public:
  explicit Stage0(const StageContext& context) : ctx_(context), flat_(*context.flat) {
    auto& params = flat_.params();
    if (params.scalar_type() == torch::kFloat32) {
      // fp32 training: the model's parameters are the master copy; no second buffer.
      master_ = params;
      master_grads_ = flat_.grads();
    } else {
      master_ = params.to(torch::kFloat32);
      master_grads_ = torch::zeros_like(master_);
    }
  }

  int stage() const override { return 0; }

  void after_backward(bool) override {}

  void reduce_gradients() override {
    auto& grads = flat_.grads();
    const int world = ctx_.comm->world_size();
    const double pre = ctx_.prescale_gradients ? ctx_.gradient_predivide_factor : 1.0;
    if (pre != 1.0) grads.div_(pre);
    if (world > 1) {
      // Bucketed so a huge model does not need one giant collective; buckets are issued back to back and
      // awaited together.
      const int64_t bucket = std::max<int64_t>(1, ctx_.reduce_bucket_size);
      std::vector<Handle> pending;
      for (int64_t begin = 0; begin < grads.numel(); begin += bucket) {
        auto chunk = grads.narrow(0, begin, std::min(bucket, grads.numel() - begin));
        pending.push_back(ctx_.comm->all_reduce(chunk, ReduceOp::kSum));
      }
      for (auto& h : pending) h.wait();
    }
    if (!master_grads_.is_same(grads)) master_grads_.copy_(grads);
    const double post = pre / world;
    if (post != 1.0) master_grads_.mul_(post);
  }

  torch::Tensor& master_params() override { return master_; }
  torch::Tensor& master_grads() override { return master_grads_; }

  // Every rank holds the whole (identical) gradient; each counts only its layout partition toward the norm.
  torch::Tensor grad_shard() override {
    const auto range = flat_.layout().partition(ctx_.comm->rank());
    return master_grads_.narrow(0, range.begin, range.size());
  }

  void publish_params() override {
    if (!master_.is_same(flat_.params())) flat_.params().copy_(master_);
  }

  void zero_grads() override { flat_.zero_grads(); }

  StageMemory memory() const override {
    StageMemory m;
    const FlatParams& flat = flat_;
    m.params16 = flat.params().nbytes();
    m.grads16 = flat.grads().nbytes();
    m.master = master_.is_same(flat.params()) ? 0 : master_.nbytes();
    m.master_grads = master_grads_.is_same(flat.grads()) ? 0 : master_grads_.nbytes();
    return m;
  }

 private:
  StageContext ctx_;
  FlatParams& flat_;
  torch::Tensor master_;        // (padded_numel) fp32
  torch::Tensor master_grads_;  // (padded_numel) fp32
};

}  // namespace

std::unique_ptr<ZeroStage> make_stage0(const StageContext& context) { return std::make_unique<Stage0>(context); }

}  // namespace dscpp
