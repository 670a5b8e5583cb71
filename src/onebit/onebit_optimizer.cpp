// make_onebit_optimizer: picks the 1-bit optimizer the config names (onebit_optimizer.h).
#include "dscpp/onebit/onebit_optimizer.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

#include "onebit_common.h"

namespace dscpp {

bool is_onebit_optimizer(const OptimizerConfig& config) {
  return std::holds_alternative<OneBitAdamOptions>(config.options) ||
         std::holds_alternative<ZeroOneAdamOptions>(config.options) ||
         std::holds_alternative<OneBitLambOptions>(config.options);
}

std::unique_ptr<FlatOptimizer> make_onebit_optimizer(const OptimizerConfig& config, int64_t numel,
                                                     const torch::TensorOptions& state_options,
                                                     std::shared_ptr<Comm> comm) {
  if (!comm) throw std::invalid_argument("make_onebit_optimizer: no data-parallel comm");
  if (numel < 0) throw std::invalid_argument("make_onebit_optimizer: numel must be >= 0, got " + std::to_string(numel));
  const auto options = state_options.dtype(torch::kFloat32).requires_grad(false);
  if (const auto* o = std::get_if<OneBitAdamOptions>(&config.options)) {
    return onebit::make_onebit_adam(*o, numel, options, std::move(comm));
  }
  if (const auto* o = std::get_if<ZeroOneAdamOptions>(&config.options)) {
    return onebit::make_zero_one_adam(*o, numel, options, std::move(comm));
  }
  if (const auto* o = std::get_if<OneBitLambOptions>(&config.options)) {
    return onebit::make_onebit_lamb(*o, numel, options, std::move(comm));
  }
  throw std::invalid_argument("make_onebit_optimizer: optimizer.type \"" + config.type +
                              "\" is not a 1-bit optimizer (OneBitAdam, ZeroOneAdam, OneBitLamb)");
}

}  // namespace dscpp
