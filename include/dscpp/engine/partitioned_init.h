// PartitionedInit: DeepSpeed's zero.Init — build a model for ZeRO-3 so that no rank ever holds all of its
// parameters, which is what lets a model larger than one process's memory exist at all.
//
// LibTorch has no hook into module construction, so the model's constructor calls partition(unit) itself as each
// gather unit (a transformer block) is complete and initialised. Every rank then takes rank 0's values of the
// unit, keeps its 1/N shard in the compute dtype and frees the rest; the parameters stay registered as 0-element
// tensors until the engine takes the shards. A rank holds at most its shards so far, one unit whole, and the
// parameters outside every unit (embeddings, final norm), which dscpp::initialize partitions as before.
//
//   auto zero_init = std::make_shared<dscpp::PartitionedInit>(config);    // joins the job
//   gpt::Gpt model(model_config, [&](auto block) { zero_init->partition(block); });
//   dscpp::InitOptions options;
//   options.partitioned = zero_init;                                       // its units are the gather units
//   auto engine = dscpp::initialize(model.ptr(), config, options);
//
// The values equal a whole build's as long as the constructor draws them in the same order either way (initialise
// each unit before handing it over; never touch it after).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "dscpp/comm/comm.h"
#include "dscpp/config/config.h"
#include "dscpp/zero/partition_unit.h"

namespace dscpp {

class PartitionedInit {
 public:
  // Reads the compute dtype and zero_optimization's persistence thresholds (param and model) from `config`, whose
  // zero_optimization.stage must be 3 (ConfigError otherwise). Joins the job from the torchrun-style environment
  // unless `comm` is given; dscpp::initialize then uses the same comm. Shards are kept on `device`.
  explicit PartitionedInit(const Config& config, std::shared_ptr<Comm> comm = nullptr,
                           torch::Device device = torch::kCPU);

  // `unit` is built and initialised: keep this rank's shard of it and free the rest. Collective: every rank calls
  // it for the same units in the same order. Throws std::logic_error once the units went to dscpp::initialize.
  void partition(const std::shared_ptr<torch::nn::Module>& unit);

  // The Python front end's way (dscpp.zero.Init): `params` (one module's own, named) cut down as one unit, which is
  // returned rather than kept; the caller hands it to the engine with the model's tensors
  // (ModelTensors::prepartitioned). Collective, as partition().
  PrepartitionedUnit partition_params(const std::vector<std::pair<std::string, torch::Tensor>>& params);

  const std::shared_ptr<Comm>& comm() const { return comm_; }
  torch::ScalarType dtype() const { return c10::typeMetaToScalarType(options_.dtype()); }
  // The units partitioned so far, in order (they become the engine's gather units).
  std::vector<std::shared_ptr<torch::nn::Module>> units() const;

  // For dscpp::initialize: hands the units over (once).
  std::vector<PrepartitionedUnit> take_units();

 private:
  std::shared_ptr<Comm> comm_;
  torch::TensorOptions options_;
  PersistenceRule persistent_;  // one rule across the units, in the order they are built
  std::vector<PrepartitionedUnit> units_;
  std::unordered_set<const c10::TensorImpl*> taken_;
  bool handed_over_ = false;
};

}  // namespace dscpp
