// Stage 0: plain data parallel — full master weights and optimizer state on every rank, gradients all-reduced
// group by group at the accumulation boundary. In fp32 the model's own flat buffers are the master copy and its
// gradient; in 16-bit training the fp32 gradient exists only from the boundary to zero_grads().
#include "dscpp/zero/grad_norm.h"
#include "dscpp/zero/in_flight.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {
namespace {

class Stage0 final : public ZeroStage {
 public:
  explicit Stage0(const StageContext& context) : ctx_(context), flat_(*context.flat) {
    flat_.attach_grad_buffer();
    // fp32 training: the model's parameters are the master copy; no second buffer.
    master_ = flat_.dtype() == torch::kFloat32 ? flat_.params() : flat_.params().to(torch::kFloat32);
  }

  int stage() const override { return 0; }

  void before_backward() override { flat_.keep_grads_attached(); }
  void after_backward() override { flat_.check_grads_attached(); }

  void reduce_gradients() override {
    local_ = false;
    auto& grads = flat_.grads();
    if (ctx_.grad_pre_divide != 1.0) grads.div_(ctx_.grad_pre_divide);
    if (ctx_.comm->world_size() > 1) {
      const auto comm_dtype = ctx_.comm_dtype.value_or(grads.scalar_type());
      InFlight in_flight(kMaxCollectivesInFlight);
      for (const auto& g : flat_.layout().groups()) {
        auto& comm = ctx_.comm_for(g);
        if (comm.world_size() == 1) continue;
        auto chunk = grads.narrow(0, g.offset, g.numel);
        if (comm_dtype == chunk.scalar_type()) {
          in_flight.push(comm.all_reduce(chunk, ReduceOp::kSum), {chunk});
        } else {
          // Reduce a copy in the communication dtype, then bring the sum back into the gradient buffer.
          auto wire = chunk.to(comm_dtype);
          Handle reduce = comm.all_reduce(wire, ReduceOp::kSum);
          in_flight.push(Handle([reduce, wire, chunk]() mutable {
                           reduce.wait();
                           chunk.copy_(wire);
                         }));
        }
      }
      in_flight.drain();
    }
    master_grads_ = grads.scalar_type() == torch::kFloat32 ? grads : grads.to(torch::kFloat32);
    if (ctx_.grad_post_scale != 1.0) master_grads_.mul_(ctx_.grad_post_scale);
  }

  void keep_local_gradients() override {
    local_ = true;
    auto& grads = flat_.grads();
    master_grads_ = grads.scalar_type() == torch::kFloat32 ? grads : grads.to(torch::kFloat32);
  }

  const FlatLayout& layout() const override { return flat_.layout(); }
  bool master_is_whole() const override { return true; }
  // The config rejects offload_optimizer at stage 0: there is no partition to offload.
  void publish_range(int64_t, const torch::Tensor&) override {
    throw std::logic_error("ZeRO stage 0 has no partition to publish in pieces (offload_optimizer needs stage 1-3)");
  }
  void finish_publish() override { publish_range(0, {}); }
  void release_master() override { publish_range(0, {}); }
  torch::Tensor& master_params() override { return master_; }
  torch::Tensor& master_grads() override { return master_grads_; }

  // Every rank holds the whole (identical) gradient; each counts only its own shard of each group. A rank's own
  // gradient (keep_local_gradients) counts whole, over the world size.
  torch::Tensor local_grad_sq_norm() override {
    if (local_) return squared_norm_fp64(master_grads_) / static_cast<double>(ctx_.comm->world_size());
    const auto& layout = flat_.layout();
    auto total = torch::zeros({}, master_grads_.options().dtype(torch::kFloat64));
    for (size_t g = 0; g < layout.groups().size(); ++g) {
      const auto shard = master_grads_.narrow(0, layout.shard_offset(static_cast<int>(g), ctx_.comm->rank()),
                                              layout.groups()[g].shard_numel);
      total += squared_norm_fp64(shard);
    }
    return total;
  }

  void publish_params() override {
    if (!master_.is_same(flat_.params())) flat_.params().copy_(master_);
  }

  void zero_grads() override {
    flat_.zero_grads();
    master_grads_ = torch::Tensor();
  }

  void visit_params(const ParamVisitor& fn) override { flat_.visit(fn); }

  StageMemory memory() const override {
    StageMemory m;
    m.params16 = flat_.params().nbytes();
    m.grads16 = flat_.grads().nbytes();
    m.master = master_.is_same(flat_.params()) ? 0 : master_.nbytes();
    // The fp32 gradient at the boundary, when it is a copy rather than the gradient buffer itself.
    m.buffers = flat_.dtype() == torch::kFloat32 ? 0 : flat_.grads().numel() * 4;
    return m;
  }

 private:
  StageContext ctx_;
  FlatParams& flat_;
  torch::Tensor master_;        // (padded_numel) fp32
  torch::Tensor master_grads_;  // (padded_numel) fp32, from reduce_gradients() to zero_grads()
  bool local_ = false;          // master_grads_ is this rank's own gradient (keep_local_gradients)
};

}  // namespace

std::unique_ptr<ZeroStage> make_stage0(const StageContext& context) { return std::make_unique<Stage0>(context); }

}  // namespace dscpp
