// Engine: sequences one training step over the parts assemble() built (see engine.h for the order).
#include "dscpp/engine/engine.h"

#include <cmath>
#include <map>

#include "dscpp/checkpoint/safetensors.h"
#include "dscpp/fault/kill_point.h"
#include "dscpp/monitor/step_log.h"

namespace dscpp {

Engine::Engine(std::shared_ptr<torch::nn::Module> model, Config config, InitOptions options)
    : Engine(assemble(std::move(model), std::move(config), std::move(options))) {}

Engine::Engine(ModelTensors model, Config config, InitOptions options)
    : Engine(assemble(std::move(model), std::move(config), std::move(options))) {}

Engine::Engine(EngineParts parts)
    : config_(std::move(parts.config)),
      model_(std::move(parts.model)),
      layout_(std::move(parts.layout)),
      observer_(std::move(parts.observer)),
      flat_(std::move(parts.flat)),
      stage_(std::move(parts.stage)),
      optimizer_(std::move(parts.optimizer)),
      optimizer_step_(std::move(parts.optimizer_step)),
      schedule_(std::move(parts.schedule)),
      scaler_(std::move(parts.scaler)),
      checkpointing_(std::move(parts.checkpointing)) {
  // The checkpointer reads and writes the parts in place, so it is made once they have their final home.
  CheckpointedState checkpointed{config_,          layout_->data(), *stage_,  *optimizer_,
                                 optimizer_step_->offload(), *scaler_, progress_, model_.params,
                                 model_.module_state, model_.dtype, model_.device, observer_->log_sink()};
  checkpointed.forward_only = model_.forward_only;
  layout_->describe(checkpointed);
  checkpointer_ = std::make_unique<Checkpointer>(std::move(checkpointed));
  loss_sum_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(model_.device));
}

bool Engine::is_gradient_accumulation_boundary() const {
  if (boundary_override_) return *boundary_override_;
  return (progress_.micro_steps + 1) % config_.batch.grad_accum == 0;
}

// After s applied steps the schedule stands at iteration s - 1 (-1: as built), as DeepSpeed's after s scheduler steps.
double Engine::lr() const { return schedule_->lr_at(progress_.schedule_steps - 1); }

void Engine::set_lr(double lr) {
  if (config_.scheduler) {
    throw std::logic_error("set_lr: the config's \"scheduler\" (" + config_.scheduler->type + ") drives the lr; "
                           "remove it to run a schedule of your own");
  }
  if (!(lr >= 0)) throw std::invalid_argument("set_lr: lr must be a number >= 0, got " + std::to_string(lr));
  schedule_ = std::make_unique<ConstantLR>(lr);
}

void Engine::set_group_lr(size_t group, double lr) {
  if (config_.scheduler) {
    throw std::logic_error("set_group_lr: the config's \"scheduler\" (" + config_.scheduler->type + ") drives every "
                           "group's lr; remove it to run a schedule of your own");
  }
  optimizer_->set_group_lr(static_cast<int>(group), lr);  // checks the group and the lr
}

std::vector<double> Engine::group_lrs() const {
  std::vector<double> out;
  for (const auto& group : optimizer_->groups()) out.push_back(group.lr.value_or(lr()));
  return out;
}

torch::Tensor Engine::forward(const std::function<torch::Tensor()>& loss_fn) {
  begin_forward();
  auto loss = loss_fn();
  end_forward(loss.defined() && loss.requires_grad());
  return loss;
}

void Engine::begin_forward() {
  fault::kill_point("engine.forward");
  observer_->forward_begins(progress_.global_steps + 1);
  stage_->before_forward();
  checkpointing_->begin_forward();
}

void Engine::end_forward(bool will_backward) {
  stage_->after_forward(will_backward && !model_.forward_only);  // forward only: nothing comes back for them
  observer_->forward_ends();
}

torch::Tensor Engine::run_unit(const torch::nn::Module& unit, const std::function<torch::Tensor()>& unit_forward) {
  auto it = model_.unit_of.find(&unit);
  return run_unit(it == model_.unit_of.end() ? -1 : it->second, unit_forward);  // -1: ZeRO-3 says it is no unit
}

torch::Tensor Engine::run_unit(int unit, const std::function<torch::Tensor()>& unit_forward) {
  return observer_->in_unit(model_.unit_names, unit, [&] { return stage_->run_unit(unit, unit_forward); });
}

void Engine::backward(const torch::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1) {
    throw std::invalid_argument("Engine::backward: loss must be a scalar tensor, got " +
                                (loss.defined() ? std::to_string(loss.numel()) + " elements" : std::string("undefined")));
  }
  run_backward([&] {
    loss_sum_ += loss.detach().to(torch::kFloat32).reshape({});
    // fp32 scaling: a 16-bit loss times 2^16 would itself overflow.
    const double factor = scaler_->scale() / static_cast<double>(config_.batch.grad_accum);
    (loss.to(torch::kFloat32) * factor).backward();
  });
}

void Engine::backward_from(const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& grads) {
  if (outputs.size() != grads.size()) {
    throw std::invalid_argument("Engine::backward_from: " + std::to_string(outputs.size()) + " outputs but " +
                                std::to_string(grads.size()) + " gradients");
  }
  run_backward([&] { torch::autograd::backward(outputs, grads); });
}

void Engine::refuse_if_forward_only(const char* call) const {
  if (model_.forward_only) {
    throw std::logic_error(std::string("Engine::") + call + ": this engine was built forward only "
                           "(InitOptions::forward_only: every parameter held frozen, no optimizer); it does not train");
  }
}

void Engine::run_backward(const std::function<void()>& autograd) {
  refuse_if_forward_only("backward");
  fault::kill_point("engine.backward");
  {
    StepObserver::PhaseTimer whole(*observer_, Phase::kBackward);
    {
      StepObserver::PhaseTimer inner(*observer_, Phase::kBackwardInner);
      stage_->before_backward();
      autograd();
    }
    StepObserver::PhaseTimer reduce(*observer_, Phase::kBackwardAllreduce);
    stage_->after_backward();  // waits for the reductions backward launched (stages 2, 3)
  }
  observer_->backward_ends();
}

bool Engine::step() {
  refuse_if_forward_only("step");
  const bool boundary = is_gradient_accumulation_boundary();
  ++progress_.micro_steps;
  if (!boundary) return false;
  fault::kill_point("engine.step");
  StepReport report;
  update(report);
  observer_->step_ends(report, progress_, [this] { return print_details(); });
  last_step_ = report;
  return !report.skipped;
}

void Engine::update(StepReport& report) {
  // The schedule's iteration this step runs at: one behind the steps applied (skipped ones not counted), as
  // DeepSpeed's scheduler, stepped after each applied optimizer step, stands.
  const int64_t iteration = progress_.schedule_steps - 1;
  const double step_lr = schedule_->lr_at(iteration);
  report.lr = step_lr;  // what a skipped step leaves for the next; an applied one moves it on below
  report.loss_scale = scaler_->scale();
  ++progress_.global_steps;
  progress_.global_samples += config_.batch.train_batch_size;
  report.step = progress_.global_steps;

  {  // The boundary's reduction is backward's (DeepSpeed's backward_allreduce); the rest of this is the step.
    // A 1-bit optimizer past its warm-up averages compressed momentum instead: no gradient all-reduce then.
    StepObserver::PhaseTimer reduce(*observer_, Phase::kBackwardAllreduce, Phase::kBackward);
    if (optimizer_->wants_local_gradients()) {
      stage_->keep_local_gradients();
    } else {
      stage_->reduce_gradients();
    }
  }
  StepObserver::PhaseTimer step_timer(*observer_, Phase::kStep);
  auto& grads = stage_->master_grads();

  // One reduction for both numbers: this rank's share of ‖g‖² and its loss sum. inf/nan anywhere makes the
  // global norm non-finite on every rank, so all ranks agree on the overflow.
  const auto local_sq = layout_->local_grad_sq_norm(*stage_);
  auto packed = torch::stack({local_sq.to(loss_sum_.device()), loss_sum_.to(torch::kFloat64)});
  layout_->reduce_norm_and_loss(packed);
  const auto host = packed.to(torch::kCPU);  // one device sync for both numbers
  const double scaled_norm = std::sqrt(host.data_ptr<double>()[0]);
  report.loss = host.data_ptr<double>()[1] / (config_.batch.grad_accum * world_size());
  loss_sum_.zero_();

  const bool overflow = !std::isfinite(scaled_norm);
  report.grad_norm = scaled_norm / report.loss_scale;
  if (scaler_->update(overflow, report.step)) {
    report.skipped = true;
    ++progress_.skipped_steps;
    stage_->zero_grads();
    return;
  }

  // Unscale and clip in one pass.
  double coef = 1.0 / report.loss_scale;
  const double clip = config_.gradient_clipping;
  if (clip > 0 && report.grad_norm > clip) coef *= clip / (report.grad_norm + 1e-6);
  if (coef != 1.0) grads.mul_(coef);

  if (auto betas = schedule_->betas_at(iteration)) optimizer_->set_betas(betas->beta1, betas->beta2);
  optimizer_step_->run(grads, step_lr);
  ++progress_.schedule_steps;
  report.lr = lr();  // as DeepSpeed's get_lr() after the step: the lr the next step will use
  stage_->zero_grads();
}

std::vector<std::string> Engine::print_details() const {
  std::vector<std::string> lines;
  if (config_.memory_breakdown) {
    const auto all = memory_breakdown_all_ranks();
    for (int r = 0; r < static_cast<int>(all.size()); ++r) lines.push_back(describe(all[r], r));
  }
  if (config_.activation_checkpointing.profile) lines.push_back(describe(checkpointing_->stats(), /*with_times=*/true));
  return lines;
}

bool Engine::save_16bit_model(const std::string& path) {
  layout_->refuse_split_model("save_16bit_model");
  if (stage_->stage() == 3 && !config_.zero.stage3_gather_16bit_weights_on_model_save) {
    observer_->log("[deepspeed.cpp] save_16bit_model(" + path + ") did not save: under ZeRO-3 it needs "
         "zero_optimization.stage3_gather_16bit_weights_on_model_save: true");
    return false;
  }
  // Rank 0 opens the file first and every rank learns whether it could, so a bad path fails on all ranks at once
  // instead of leaving the others in a gather.
  std::unique_ptr<SafetensorsWriter> writer;
  std::string error;
  if (rank() == 0) {
    // The same parameters, names and order the stage visits; their sizes stay valid while ZeRO-3 holds no storage.
    std::vector<TensorInfo> infos;
    for (const auto& p : model_.params) infos.push_back({p.name, model_.dtype, p.shape});
    try {
      writer = std::make_unique<SafetensorsWriter>(path, infos, std::map<std::string, std::string>{{"format", "pt"}});
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (layout_->data().side_all_gather({error.empty() ? 0 : 1})[0] != 0) {
    throw std::runtime_error("save_16bit_model: rank 0 could not create the file: " +
                             (error.empty() ? path : error));
  }
  stage_->visit_params([&](const std::string& name, const torch::Tensor& value) {
    if (writer) writer->write(name, value);
  });
  if (writer) writer->close();
  return true;
}

void Engine::write_frozen(const std::string& name, const torch::Tensor& value) {
  for (const auto& t : model_.module_state) {
    if (!t.frozen || t.name != name) continue;
    if (value.sizes().vec() != t.shape) {
      throw std::invalid_argument("write_frozen: the value given for '" + name + "' is " + c10::str(value.sizes()) +
                                  ", the parameter is " + c10::str(c10::IntArrayRef(t.shape)));
    }
    stage_->write_frozen(t.tensor, value);
    return;
  }
  throw std::invalid_argument("write_frozen: '" + name + "' is not a frozen parameter of this model");
}

ModelStateMemory Engine::memory() const {
  ModelStateMemory m;
  m.stage = stage_->memory();
  // Frozen parameters the stage does not partition (all but ZeRO-3's floating ones) are whole on every rank.
  for (const auto& t : model_.module_state) {
    if (!t.frozen || stage_->partitions_frozen(t.tensor)) continue;
    m.stage.params16 += t.tensor.nbytes();
    m.stage.frozen += t.tensor.nbytes();
  }
  for (auto& [name, tensor] : optimizer_->state_tensors()) m.optimizer_state += tensor.nbytes();
  for (auto& [name, tensor] : optimizer_->rank_state()) m.optimizer_state += tensor.nbytes();
  for (auto& [name, tensor] : optimizer_->replicated_state()) m.optimizer_state += tensor.nbytes();
  return m;
}

MemoryBreakdown Engine::memory_breakdown() const {
  MemoryBreakdown b;
  b.states = memory();
  b.activations_peak = observer_->activations_peak();
  const auto& s = b.states.stage;
  if (config_.zero.offload_optimizer.device == OffloadDevice::kCpu) b.offloaded_host += s.master + b.states.optimizer_state;
  if (config_.zero.offload_param.device == OffloadDevice::kCpu) b.offloaded_host += s.params16 - s.persistent;
  b.nvme = stage_->timers().param_swap.file_bytes + optimizer_swap().file_bytes;
  b.rss = resident_bytes();
  b.live_tensors = observer_->live_tensor_bytes().value_or(-1);
  return b;
}

StateStore::SwapStats Engine::optimizer_swap() const {
  const OptimizerOffload* offload = optimizer_step_->offload();
  return offload ? offload->store().stats() : StateStore::SwapStats{};
}

std::vector<MemoryBreakdown> Engine::memory_breakdown_all_ranks() const {
  const auto all = layout_->data().side_all_gather(memory_breakdown().pack());
  std::vector<MemoryBreakdown> out;
  for (int r = 0; r < world_size(); ++r) {
    out.push_back(MemoryBreakdown::unpack(&all[r * MemoryBreakdown::kPacked]));
  }
  return out;
}

std::unique_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model, const Config& config, InitOptions options) {
  return std::make_unique<Engine>(std::move(model), config, std::move(options));
}

std::unique_ptr<Engine> initialize(ModelTensors model, const Config& config, InitOptions options) {
  return std::make_unique<Engine>(std::move(model), config, std::move(options));
}

}  // namespace dscpp
