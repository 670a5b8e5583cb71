// Stage 0: plain data parallel — full master weights and optimizer state on every rank, gradients all-reduced
// group by group at the accumulation boundary. In fp32 the model's own flat buffer is the master copy.
#include "dscpp/compat/torch_compat.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {
namespace {

class Stage0 final : public ZeroStage {
 public:
  explicit Stage0(const StageContext& context) : ctx_(context), flat_(*context.flat) {
    flat_.attach_grad_buffer();
    if (flat_.dtype() == torch::kFloat32) {
      // fp32 training: the model's parameters are the master copy; no second buffer.
      master_ = flat_.params();
      master_grads_ = flat_.grads();
    } else {
      master_ = flat_.params().to(torch::kFloat32);
      master_grads_ = torch::zeros_like(master_);
    }
  }

  int stage() const override { return 0; }

  void before_backward() override {
    if (!flat_.grads_attached()) flat_.zero_grads();  // the user set .grad to None (module->zero_grad())
  }
  void after_backward() override {}

  void reduce_gradients() override {
    auto& grads = flat_.grads();
    const int world = ctx_.comm->world_size();
    const double pre = ctx_.prescale_gradients ? ctx_.gradient_predivide_factor : 1.0;
    if (world > 1) {
      const auto comm_dtype = ctx_.comm_dtype.value_or(grads.scalar_type());
      std::vector<Handle> pending;
      std::vector<torch::Tensor> wire;  // what travels: the group itself, or a copy in the communication dtype
      for (const auto& g : flat_.layout().groups()) {
        auto chunk = grads.narrow(0, g.offset, g.numel);
        auto buffer = comm_dtype == chunk.scalar_type() ? chunk : chunk.to(comm_dtype);
        if (pre != 1.0) buffer.div_(pre);
        pending.push_back(ctx_.comm->all_reduce(buffer, ReduceOp::kSum));
        wire.push_back(buffer);
      }
      for (size_t i = 0; i < pending.size(); ++i) {
        pending[i].wait();
        const auto& g = flat_.layout().groups()[i];
        auto chunk = grads.narrow(0, g.offset, g.numel);
        if (wire[i].data_ptr() != chunk.data_ptr()) chunk.copy_(wire[i]);
      }
    } else if (pre != 1.0) {
      grads.div_(pre);
    }
    if (!master_grads_.is_same(grads)) master_grads_.copy_(grads);
    const double post = pre / world;
    if (post != 1.0) master_grads_.mul_(post);
  }

  torch::Tensor& master_params() override { return master_; }
  torch::Tensor& master_grads() override { return master_grads_; }

  // Every rank holds the whole (identical) gradient; each counts only its own shard of each group.
  torch::Tensor local_grad_sq_norm() override {
    const auto& layout = flat_.layout();
    auto total = torch::zeros({}, master_grads_.options().dtype(torch::kFloat64));
    for (size_t g = 0; g < layout.groups().size(); ++g) {
      const auto shard = master_grads_.narrow(0, layout.shard_offset(static_cast<int>(g), ctx_.comm->rank()),
                                              layout.groups()[g].shard_numel);
      auto norm = compat::l2_norm_fp64(shard);
      total += norm * norm;
    }
    return total;
  }

  void publish_params() override {
    if (!master_.is_same(flat_.params())) flat_.params().copy_(master_);
  }

  void zero_grads() override { flat_.zero_grads(); }

  StageMemory memory() const override {
    StageMemory m;
    m.params16 = flat_.params().nbytes();
    m.grads16 = flat_.grads().nbytes();
    m.master = master_.is_same(flat_.params()) ? 0 : master_.nbytes();
    m.buffers = master_grads_.is_same(flat_.grads()) ? 0 : master_grads_.nbytes();
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
