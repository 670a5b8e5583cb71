// Optimizer options: plain values with DeepSpeed's defaults, parsed from the config's "optimizer" section.
// Torch-free on purpose: the config layer depends on these, and it must not pull in LibTorch.
#pragma once

#include <array>
#include <string>
#include <variant>

namespace dscpp {

// Adam and AdamW (DeepSpeed's FusedAdam / torch.optim.AdamW semantics).
// DeepSpeed quirk kept on purpose: for "type": "Adam" the decay is decoupled (AdamW) unless
// "adam_w_mode": false, because DeepSpeed's ADAM_W_MODE_DEFAULT is true.
struct AdamOptions {
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adam_w_mode = true;       // decoupled weight decay (AdamW); false: L2 added to the gradient
  bool bias_correction = true;
  bool torch_adam = false;       // accepted for compatibility; our flat Adam is used either way
  bool amsgrad = false;          // torch.optim.Adam(W)'s AMSGrad: the denominator uses max over steps of v
};

// torch.optim.SGD semantics.
struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;         // requires momentum > 0 and dampening == 0
};

// Lion (Chen et al. 2023; DeepSpeed FusedLion): decoupled weight decay.
struct LionOptions {
  double lr = 1e-4;
  std::array<double, 2> betas{0.9, 0.99};
  double weight_decay = 0.0;
};

// torch.optim.Adagrad semantics (DeepSpeed's CPU Adagrad uses the same defaults).
struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
};

// Lamb is parsed so configs that name it are accepted; enabling it is "not supported yet".
struct LambOptions {
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  double max_coeff = 10.0;
  double min_coeff = 0.01;
};

using OptimizerOptions = std::variant<AdamOptions, SgdOptions, LionOptions, AdagradOptions, LambOptions>;

// "Adam", "AdamW", "SGD", "Lion", "Adagrad", "Lamb" as DeepSpeed spells them (matched case-insensitively).
struct OptimizerConfig {
  std::string type;              // canonical spelling, e.g. "AdamW"
  OptimizerOptions options;

  // The configured base lr, whatever the type.
  double lr() const {
    return std::visit([](const auto& o) { return o.lr; }, options);
  }
};

}  // namespace dscpp
