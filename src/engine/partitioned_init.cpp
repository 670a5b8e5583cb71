// PartitionedInit: the units of a model built partitioned, held until dscpp::initialize takes them.
#include "dscpp/engine/partitioned_init.h"

#include <stdexcept>

#include "dscpp/comm/dist_env.h"
#include "dscpp/config/config_error.h"
#include "dscpp/engine/device.h"

namespace dscpp {

PartitionedInit::PartitionedInit(const Config& config, std::shared_ptr<Comm> comm, torch::Device device)
    : comm_(std::move(comm)),
      options_(torch::TensorOptions().dtype(to_scalar_type(config.compute_dtype())).device(device)),
      persistent_(config.zero.stage3_param_persistence_threshold, config.zero.stage3_model_persistence_threshold) {
  if (config.zero.stage != 3) {
    throw ConfigError("zero_optimization.stage is " + std::to_string(config.zero.stage) +
                      ": building a model partitioned (PartitionedInit, DeepSpeed's zero.Init) needs stage 3");
  }
  if (!comm_) {
    const DistEnv env = DistEnv::from_env();
    make_current(device);
    comm_ = init_comm(env, comm_backend_for(device, env.local_size));
  }
}

void PartitionedInit::partition(const std::shared_ptr<torch::nn::Module>& unit) {
  if (handed_over_) {
    throw std::logic_error("PartitionedInit::partition: the units were already handed to dscpp::initialize; "
                           "build the whole model before initializing the engine");
  }
  units_.push_back(partition_unit(unit, *comm_, options_, persistent_, taken_));
}

PrepartitionedUnit PartitionedInit::partition_params(const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  return partition_unit(params, *comm_, options_, persistent_, taken_);
}

std::vector<std::shared_ptr<torch::nn::Module>> PartitionedInit::units() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const auto& unit : units_) out.push_back(unit.module);
  return out;
}

std::vector<PrepartitionedUnit> PartitionedInit::take_units() {
  if (handed_over_) {
    throw std::logic_error("PartitionedInit: already given to one dscpp::initialize; build the model again for "
                           "another engine");
  }
  handed_over_ = true;
  return std::move(units_);
}

}  // namespace dscpp
