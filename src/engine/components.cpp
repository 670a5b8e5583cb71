// Config → engine parts. Every switch on a config value that selects behaviour lives here.
#include "dscpp/engine/components.h"

#include "dscpp/offload/nvme_store.h"

namespace dscpp {
namespace {

void reject(const std::string& key, const std::string& what) {
  throw ConfigError(key + ": " + what + " is not supported yet by deepspeed.cpp");
}

}  // namespace

torch::ScalarType to_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return torch::kFloat32;
    case DType::kFloat16: return torch::kFloat16;
    case DType::kBFloat16: return torch::kBFloat16;
  }
  throw std::logic_error("to_scalar_type: unknown DType");
}

std::unique_ptr<LossScaler> make_loss_scaler(const Config& config, std::function<void(const std::string&)> log) {
  if (!config.fp16.enabled) return make_unit_scaler();
  const auto& options = config.fp16.scaler;
  if (options.static_scale > 0) return make_static_scaler(options.static_scale, std::move(log));
  return make_dynamic_scaler(options, std::move(log));
}

std::unique_ptr<ZeroStage> make_zero_stage(const ZeroConfig& zero, const StageContext& context) {
  switch (zero.stage) {
    case 0: return make_stage0(context);
    case 1: return make_stage1(context);
    case 2: return make_stage2(context);
    case 3: throw std::logic_error("make_zero_stage: stage 3 partitions its own parameters; use make_stage3");
    default: reject("zero_optimization.stage", "stage " + std::to_string(zero.stage));
  }
  return nullptr;
}

std::unique_ptr<StateStore> make_optimizer_store(const Config& config, ZeroStage& stage, FlatOptimizer& optimizer,
                                                 int rank) {
  const auto& offload = config.zero.offload_optimizer;
  torch::Tensor master = stage.master_params();
  if (offload.device == OffloadDevice::kCpu) {
    std::vector<torch::Tensor> state;
    for (auto& [kind, tensor] : optimizer.state_tensors()) state.push_back(tensor);
    return make_resident_store(master, std::move(state), config.zero.sub_group_size);
  }
  NvmeStoreOptions o;
  o.nvme_path = offload.nvme_path;
  o.config_key = "zero_optimization.offload_optimizer.nvme_path";
  o.rank = rank;
  o.sub_group_sizes = uniform_sub_groups(master.numel(), config.zero.sub_group_size);
  o.kinds = 1 + static_cast<int>(optimizer.state_kinds().size());
  o.buffer_count = offload.buffer_count;
  o.pin_memory = offload.pin_memory;
  o.aio = config.aio;
  o.initial_values = [&](int i, const std::vector<torch::Tensor>& slices) {
    slices[0].copy_(master.narrow(0, i * config.zero.sub_group_size, slices[0].numel()));
    optimizer.init_state({slices.begin() + 1, slices.end()});
  };
  auto store = make_nvme_store(o);
  stage.release_master();
  return store;
}

void set_param_offload(const Config& config, int rank, StageContext& context) {
  const auto& param = config.zero.offload_param;
  if (param.device == OffloadDevice::kNone) return;
  context.offload_param = true;
  context.param_pin_memory = param.pin_memory;
  if (param.device != OffloadDevice::kNvme) return;
  NvmeStoreOptions o;
  o.nvme_path = param.nvme_path;
  o.config_key = "zero_optimization.offload_param.nvme_path";
  o.role = "param";
  o.rank = rank;
  o.buffer_count = param.buffer_count;
  o.pin_memory = param.pin_memory;
  o.aio = config.aio;
  o.read_ahead = false;  // ZeRO-3 says which shards come next (StateStore::prefetch)
  context.make_param_store = [o](const std::vector<int64_t>& shard_sizes, const torch::Tensor& initial) mutable {
    o.sub_group_sizes = shard_sizes;
    o.dtype = initial.scalar_type();
    std::vector<int64_t> begins{0};
    for (int64_t n : shard_sizes) begins.push_back(begins.back() + n);
    o.initial_values = [&](int i, const std::vector<torch::Tensor>& slices) {
      slices[0].copy_(initial.narrow(0, begins[static_cast<size_t>(i)], slices[0].numel()));
    };
    return make_nvme_store(o);
  };
}

void set_gradient_averaging(const Config& config, int world_size, StageContext& context) {
  if (config.prescale_gradients) {
    context.grad_pre_divide = world_size;
    context.grad_post_scale = 1.0;
  } else {
    context.grad_pre_divide = config.gradient_predivide_factor;
    context.grad_post_scale = config.gradient_predivide_factor / world_size;
  }
}

}  // namespace dscpp
