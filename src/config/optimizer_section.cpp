// "optimizer": {type, params} parsed into the typed options of optim/options.h, with DeepSpeed's defaults.
#include "dscpp/config/config_error.h"
#include "dscpp/config/sections.h"

namespace dscpp {
namespace {

void check_betas(JsonReader& p, const std::array<double, 2>& betas) {
  p.require(betas[0] >= 0 && betas[0] < 1 && betas[1] >= 0 && betas[1] < 1, "betas",
            "two numbers in [0, 1), e.g. [0.9, 0.999]");
}

double read_lr(JsonReader& p, double def) {
  double lr = p.get_number("lr", def);
  p.require(lr >= 0, "lr", "a number >= 0");
  return lr;
}

double read_weight_decay(JsonReader& p) {
  double wd = p.get_number("weight_decay", 0.0);
  p.require(wd >= 0, "weight_decay", "a number >= 0");
  return wd;
}

double read_eps(JsonReader& p, double def) {
  double eps = p.get_number("eps", def);
  p.require(eps > 0, "eps", "a number > 0");
  return eps;
}

AdamOptions parse_adam(JsonReader& p, bool is_adamw) {
  AdamOptions o;
  o.lr = read_lr(p, o.lr);
  o.betas = p.get_pair("betas", o.betas);
  check_betas(p, o.betas);
  o.eps = read_eps(p, o.eps);
  o.weight_decay = read_weight_decay(p);
  o.adam_w_mode = p.get_bool("adam_w_mode", true);
  // DeepSpeed: "AdamW" is decoupled whatever adam_w_mode says; a config saying otherwise is contradictory.
  p.require(!is_adamw || o.adam_w_mode, "adam_w_mode",
            "true for \"AdamW\" (use \"type\": \"Adam\" with adam_w_mode false for L2 weight decay)");
  o.bias_correction = p.get_bool("bias_correction", true);
  o.torch_adam = p.get_bool("torch_adam", false);
  o.amsgrad = p.get_bool("amsgrad", false);
  p.accept({"fused", "set_grad_none"});
  return o;
}

SgdOptions parse_sgd(JsonReader& p) {
  SgdOptions o;
  o.lr = read_lr(p, o.lr);
  o.momentum = p.get_number("momentum", 0.0);
  p.require(o.momentum >= 0, "momentum", "a number >= 0");
  o.dampening = p.get_number("dampening", 0.0);
  o.weight_decay = read_weight_decay(p);
  o.nesterov = p.get_bool("nesterov", false);
  p.require(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "nesterov",
            "false unless momentum > 0 and dampening == 0 (torch.optim.SGD's rule)");
  return o;
}

LionOptions parse_lion(JsonReader& p) {
  LionOptions o;
  o.lr = read_lr(p, o.lr);
  o.betas = p.get_pair("betas", o.betas);
  check_betas(p, o.betas);
  o.weight_decay = read_weight_decay(p);
  return o;
}

AdagradOptions parse_adagrad(JsonReader& p) {
  AdagradOptions o;
  o.lr = read_lr(p, o.lr);
  o.lr_decay = p.get_number("lr_decay", 0.0);
  p.require(o.lr_decay >= 0, "lr_decay", "a number >= 0");
  o.weight_decay = read_weight_decay(p);
  o.initial_accumulator_value = p.get_number("initial_accumulator_value", 0.0);
  p.require(o.initial_accumulator_value >= 0, "initial_accumulator_value", "a number >= 0");
  o.eps = read_eps(p, o.eps);
  return o;
}

// The trust ratio's clamps, in DeepSpeed's range.
void read_coeffs(JsonReader& p, double& max_coeff, double& min_coeff) {
  max_coeff = p.get_number("max_coeff", max_coeff);
  min_coeff = p.get_number("min_coeff", min_coeff);
  p.require(min_coeff > 0 && min_coeff <= max_coeff, "min_coeff", "a number in (0, max_coeff]");
}

LambOptions parse_lamb(JsonReader& p) {
  LambOptions o;
  o.lr = read_lr(p, o.lr);
  o.betas = p.get_pair("betas", o.betas);
  check_betas(p, o.betas);
  o.eps = read_eps(p, o.eps);
  o.weight_decay = read_weight_decay(p);
  o.bias_correction = p.get_bool("bias_correction", true);
  o.eps_inside_sqrt = p.get_bool("eps_inside_sqrt", false);
  read_coeffs(p, o.max_coeff, o.min_coeff);
  p.require(!p.get_bool("amsgrad", false), "amsgrad", "false (FusedLamb has no AMSGrad variant; DeepSpeed refuses it)");
  // FusedLamb clips only when a fused fp16 optimizer hands it the gradient norms; in fp32 DeepSpeed fails on it.
  p.require(p.get_number("max_grad_norm", 0.0) == 0.0, "max_grad_norm",
            "0 (clip with the top-level gradient_clipping, which every optimizer here honours)");
  return o;
}

int64_t read_steps(JsonReader& p, const char* key, int64_t def, int64_t least) {
  const double value = p.get_number(key, static_cast<double>(def));
  p.require(value >= static_cast<double>(least) && value == static_cast<double>(static_cast<int64_t>(value)), key,
            "a whole number >= " + std::to_string(least));
  return static_cast<int64_t>(value);
}

// What DeepSpeed's 1-bit Adams read beside their own keys: Adam's settings, the comm backend, and three parameters
// they take and ignore: bias_correction (accepted, either value, as DeepSpeed's default true is), eps_inside_sqrt and
// max_grad_norm (refused when a value asks for an effect).
template <typename Options>
Options parse_onebit_common(JsonReader& p, const char* name) {
  Options o;
  o.lr = read_lr(p, o.lr);
  o.betas = p.get_pair("betas", o.betas);
  check_betas(p, o.betas);
  o.eps = read_eps(p, o.eps);
  o.weight_decay = read_weight_decay(p);
  o.comm_backend_name = p.get_choice("comm_backend_name", "nccl", {"nccl", "compressed", "mpi", "hccl"});
  p.require(o.comm_backend_name == "nccl" || o.comm_backend_name == "compressed", "comm_backend_name",
            "\"nccl\" or \"compressed\" (both run over the engine's c10d comm: NCCL on GPUs, Gloo on CPUs; "
            "deepspeed.cpp has no MPI or HCCL transport)");
  o.cuda_aware = p.get_bool("cuda_aware", false);
  p.require(!p.get_bool("amsgrad", false), "amsgrad", std::string("false (") + name + " has no AMSGrad variant)");
  p.get_bool("bias_correction", true);  // DeepSpeed's applies none whatever this says (docs/configuration.md)
  p.require(!p.get_bool("eps_inside_sqrt", false), "eps_inside_sqrt",
            std::string("false (DeepSpeed's ") + name + " ignores it: eps is always added to the square root)");
  p.require(p.get_number("max_grad_norm", 0.0) == 0.0, "max_grad_norm",
            std::string("0 (DeepSpeed's ") + name + " ignores it; clip with the top-level gradient_clipping)");
  return o;
}

OneBitAdamOptions parse_onebit_adam(JsonReader& p) {
  auto o = parse_onebit_common<OneBitAdamOptions>(p, "OnebitAdam");
  o.freeze_step = read_steps(p, "freeze_step", o.freeze_step, 0);
  return o;
}

OneBitLambOptions parse_onebit_lamb(JsonReader& p) {
  auto o = parse_onebit_common<OneBitLambOptions>(p, "OnebitLamb");
  o.freeze_step = read_steps(p, "freeze_step", o.freeze_step, 0);
  read_coeffs(p, o.max_coeff, o.min_coeff);
  o.coeff_beta = p.get_number("coeff_beta", o.coeff_beta);
  p.require(o.coeff_beta >= 0 && o.coeff_beta < 1, "coeff_beta", "a number in [0, 1)");
  o.factor_max = p.get_number("factor_max", o.factor_max);
  o.factor_min = p.get_number("factor_min", o.factor_min);
  p.require(o.factor_min > 0 && o.factor_min <= o.factor_max, "factor_min", "a number in (0, factor_max]");
  o.factor_threshold = p.get_number("factor_threshold", o.factor_threshold);
  p.require(o.factor_threshold >= 0 && o.factor_threshold < 1, "factor_threshold", "a number in [0, 1)");
  return o;
}

ZeroOneAdamOptions parse_zero_one_adam(JsonReader& p) {
  auto o = parse_onebit_common<ZeroOneAdamOptions>(p, "ZeroOneAdam");
  o.var_freeze_step = read_steps(p, "var_freeze_step", o.var_freeze_step, 0);
  o.var_update_scaler = read_steps(p, "var_update_scaler", o.var_update_scaler, 1);
  o.local_step_scaler = read_steps(p, "local_step_scaler", o.local_step_scaler, 1);
  o.local_step_clipper = read_steps(p, "local_step_clipper", o.local_step_clipper, 1);
  return o;
}

}  // namespace

std::optional<OptimizerConfig> parse_optimizer(JsonReader& root) {
  if (!root.has("optimizer")) {
    root.accept({"optimizer"});
    return std::nullopt;
  }
  JsonReader section = root.section("optimizer");
  section.require(section.has("type"), "type",
                  "one of Adam|AdamW|SGD|Lion|Adagrad|Lamb|OneBitAdam|ZeroOneAdam|OneBitLamb");
  OptimizerConfig config;
  config.type = section.get_choice(
      "type", "", {"Adam", "AdamW", "SGD", "Lion", "Adagrad", "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"});
  JsonReader params = section.section("params");
  if (config.type == "Adam" || config.type == "AdamW") {
    config.options = parse_adam(params, config.type == "AdamW");
  } else if (config.type == "SGD") {
    config.options = parse_sgd(params);
  } else if (config.type == "Lion") {
    config.options = parse_lion(params);
  } else if (config.type == "Adagrad") {
    config.options = parse_adagrad(params);
  } else if (config.type == "Lamb") {
    config.options = parse_lamb(params);
  } else if (config.type == "OneBitAdam") {
    config.options = parse_onebit_adam(params);
  } else if (config.type == "OneBitLamb") {
    config.options = parse_onebit_lamb(params);
  } else {
    config.options = parse_zero_one_adam(params);
  }
  params.finish();
  section.accept({"legacy_fusion"});
  section.finish();
  return config;
}

}  // namespace dscpp

