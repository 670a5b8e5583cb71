// PipelineEngine: one stage of a pipeline-parallel model, trained in DeepSpeed's 1F1B order (see pipeline_engine.h).
#include "dscpp/pipe/pipeline_engine.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "dscpp/config/config_error.h"
#include "dscpp/monitor/memory_tracker.h"
#include "dscpp/pipe/partition.h"

namespace dscpp {
namespace {

// Activations go forward on one tag, their gradients back on another: each direction between two stages is a
// channel of its own, its messages in order.
constexpr int kActivationTag = 1;
constexpr int kGradTag = 2;
// An activation's header: dtype, number of dimensions, then the dimensions.
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeader = 2 + kMaxDims;

// Registers `module` at `path` ("h.3") under `root`, making plain container modules for the path's parents, so the
// stage's parameters are named as in the whole model. The same module twice (two layers of one stage sharing it) is
// registered once.
void register_at(torch::nn::Module& root, const std::string& path, const std::shared_ptr<torch::nn::Module>& module) {
  std::vector<std::string> parts;
  std::stringstream in(path);
  for (std::string part; std::getline(in, part, '.');) {
    if (part.empty()) throw std::invalid_argument("PipeLayer: module path '" + path + "' has an empty component");
    parts.push_back(part);
  }
  if (parts.empty()) throw std::invalid_argument("PipeLayer: a module has an empty path");
  torch::nn::Module* parent = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto children = parent->named_children();
    if (const auto* child = children.find(parts[i])) {
      parent = child->get();
    } else {
      parent = parent->register_module(parts[i], std::make_shared<torch::nn::Module>()).get();
    }
  }
  auto children = parent->named_children();
  if (const auto* existing = children.find(parts.back())) {
    if (existing->get() != module.get()) {
      throw std::invalid_argument("PipeLayer: two different modules at path '" + path + "' on one stage");
    }
    return;
  }
  parent->register_module(parts.back(), module);
}

// Trainable elements of the layer's modules, each parameter once.
int64_t count_params(const PipeLayer& layer) {
  std::unordered_set<const c10::TensorImpl*> seen;
  int64_t n = 0;
  for (const auto& [path, module] : layer.modules) {
    for (const auto& p : module->parameters()) {
      if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
    }
  }
  return n;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string stages_list(const std::vector<int>& stages) {
  std::string out;
  for (int s : stages) out += (out.empty() ? "" : ", ") + std::to_string(s);
  return out;
}

}  // namespace

PipelineEngine::PipelineEngine(PipelineModel model, const Config& config, ParallelGroups groups, InitOptions options)
    : config_(config), groups_(std::move(groups)), loss_fn_(std::move(model.loss_fn)) {
  const int p = stages(), s = stage();
  if (config_.pipeline.stages != 1 && config_.pipeline.stages != p) {
    throw ConfigError("pipeline.stages is " + std::to_string(config_.pipeline.stages) + " but the rank grid has " +
                      std::to_string(p) + " pipeline stages; make them agree");
  }
  if (p > 1 && config_.zero.stage >= 2) {
    throw ConfigError("zero_optimization.stage " + std::to_string(config_.zero.stage) + " with pipeline parallelism (" +
                      std::to_string(p) + " stages): as DeepSpeed's PipelineEngine, pipelining runs with ZeRO stage 0 "
                      "or 1 only (a stage accumulates gradients over its micro-batches, which stages 2 and 3 "
                      "partition during each backward); use stage 1");
  }
  if (!loss_fn_) throw std::invalid_argument("PipelineModel::loss_fn is empty: the last stage needs a loss");
  for (const auto& layer : model.layers) {
    if (!layer.forward) throw std::invalid_argument("PipeLayer '" + layer.name + "' has no forward");
  }

  std::vector<LayerInfo> infos;
  for (const auto& layer : model.layers) infos.push_back({layer.type, count_params(layer)});
  parts_ = partition_layers(infos, p, config_.pipeline.partition);

  // Which stages use each module: one used on several is tied.
  std::map<std::string, std::set<int>> users;
  for (int stage = 0; stage < p; ++stage) {
    for (int l = parts_[stage]; l < parts_[stage + 1]; ++l) {
      for (const auto& [path, module] : model.layers[l].modules) users[path].insert(stage);
    }
  }
  module_ = std::make_shared<torch::nn::Module>();
  for (int l = parts_[s]; l < parts_[s + 1]; ++l) {
    for (const auto& [path, module] : model.layers[l].modules) register_at(*module_, path, module);
    layers_.push_back(std::move(model.layers[l]));
  }
  for (const auto& [path, stages] : users) {
    if (stages.size() > 1) ties_.push_back({path, std::vector<int>(stages.begin(), stages.end())});
  }

  // This stage's engine is assembled over the pipeline's groups; the program's names cover the whole model, of
  // which the stage keeps its own layers' (ParallelLayout::Names::other_stages_named).
  auto names = ParallelLayout::Names::of(options);
  names.other_stages_named = true;
  connect_ties(names.counted_elsewhere);
  ParallelLayout::Groups layout_groups{groups_.data, groups_.model, groups_.pipe, groups_.world,
                                       options.expert_data_parallel_group};
  for (const auto& param : module_->parameters()) {
    device_ = param.device();  // where the stage trains, and so where activations arrive
    break;
  }
  engine_ = std::make_unique<Engine>(
      assemble(module_, config_, std::move(options), std::move(layout_groups), std::move(names)));
  // The engine has re-pointed the parameters at its flat buffers: the tied copies' gradients are views of its
  // gradient buffer from here on.
  for (auto& tie : tie_groups_) {
    for (const auto& item : module_->named_parameters()) {
      if ((item.key() == tie.path || item.key().rfind(tie.path + ".", 0) == 0) && item.value().requires_grad()) {
        tie.params.push_back(item.value());
      }
    }
  }
  schedule_ = train_schedule(p, s, config_.batch.grad_accum);

  engine_->log(describe(infos, model.layers));
}

// A tie group per tied module: the stages holding a copy, within this rank's replica (same data and model
// coordinates). Splits are collective over the world, so every rank takes part in each, holding a copy or not.
void PipelineEngine::connect_ties(std::set<std::string>& counted_elsewhere) {
  const auto& topology = groups_.topology;
  const int s = stage(), replicas = topology.data() * topology.model();
  const int replica = groups_.coord.data * topology.model() + groups_.coord.model;
  for (const auto& [path, stages] : ties_) {
    const bool holds = std::find(stages.begin(), stages.end(), s) != stages.end();
    auto comm = groups_.world->split(holds ? replica : replicas + groups_.world->rank(), s);
    if (!holds) continue;
    // The copies start from the earliest stage's values, as DeepSpeed broadcasts tied weights from their owner; the
    // earliest stage counts the weight in the gradient norm, the others not again.
    torch::NoGradGuard no_grad;
    for (const auto& item : module_->named_parameters()) {
      if (item.key() != path && item.key().rfind(path + ".", 0) != 0) continue;
      auto value = item.value().data().contiguous();
      comm->broadcast(value, 0).wait();
      if (!value.is_same(item.value())) item.value().copy_(value);
      if (s != stages.front() && item.value().requires_grad()) counted_elsewhere.insert(item.key());
    }
    tie_groups_.push_back(Tie{path, comm, {}});
  }
}

// One line for the log: the grid, the schedule, every stage's layers and parameters, the ties. `all` holds the
// other stages' layers (this stage's are in layers_).
std::string PipelineEngine::describe(const std::vector<LayerInfo>& infos, const std::vector<PipeLayer>& all) const {
  const int p = stages(), s = stage();
  std::ostringstream line;
  line << "[deepspeed.cpp] pipeline: " << p << " stages × " << groups_.topology.data() << " data × "
       << groups_.topology.model() << " model, " << config_.batch.grad_accum << " micro-batches per step (1F1B, bubble "
       << bubble_fraction(p, config_.batch.grad_accum) << "), partition " << config_.pipeline.partition;
  for (int stage = 0; stage < p; ++stage) {
    int64_t params = 0;
    for (int l = parts_[stage]; l < parts_[stage + 1]; ++l) params += infos[l].params;
    const auto& first = stage == s ? layers_.front().name : all[parts_[stage]].name;
    const auto& last = stage == s ? layers_.back().name : all[parts_[stage + 1] - 1].name;
    line << "; stage " << stage << ": layers " << parts_[stage] << "-" << parts_[stage + 1] - 1 << " (" << first
         << (parts_[stage + 1] - parts_[stage] > 1 ? " … " + last : "") << "), " << params << " params";
  }
  for (const auto& [path, stages] : ties_) line << "; tied " << path << " on stages " << stages_list(stages);
  return line.str();
}

torch::Tensor PipelineEngine::run_layers(const torch::Tensor& input) {
  const int n = static_cast<int>(layers_.size());
  const int interval = config_.pipeline.activation_checkpoint_interval;
  torch::Tensor x = input;
  for (int begin = 0; begin < n;) {
    const int end = interval > 0 ? std::min(begin + interval, n) : n;
    auto chunk = [this, begin, end](const torch::Tensor& in) {
      torch::Tensor y = in;
      for (int l = begin; l < end; ++l) y = layers_[l].forward(y);
      return y;
    };
    // Only a floating-point input can carry the recompute's gradient back (as DeepSpeed, which does not checkpoint
    // the embedding): a chunk that starts from token ids runs as it is.
    const bool checkpointed = interval > 0 && x.is_floating_point() && torch::GradMode::is_enabled();
    x = checkpointed ? engine_->checkpoint(chunk, x) : chunk(x);
    begin = end;
  }
  return x;
}

void PipelineEngine::wait_idle(Handle& handle) {
  const auto start = std::chrono::steady_clock::now();
  handle.wait();
  stats_.idle_s += seconds_since(start);
}

void PipelineEngine::sample_memory() {
  if (CpuMemoryTracker::installed()) {
    stats_.activation_peak = std::max(stats_.activation_peak, CpuMemoryTracker::peak() - memory_base_);
  }
}

void PipelineEngine::forward(int micro, const MicroBatch& batch) {
  sample_memory();  // the engine's forward restarts the tracker's peak
  engine_->begin_forward();
  torch::Tensor out = run_layers(is_first_stage() ? batch.inputs : inputs_[micro]);
  if (is_last_stage()) {
    out = loss_fn_(out, batch.labels);
    if (!out.defined() || out.numel() != 1) {
      throw std::invalid_argument("PipelineModel::loss_fn must return the micro-batch's loss as one element");
    }
  }
  engine_->end_forward(/*will_backward=*/true);
  outputs_[micro] = out;
  stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight_);
}

void PipelineEngine::backward(int micro) {
  if (is_last_stage()) {
    engine_->backward(outputs_[micro]);
  } else {
    engine_->backward_from({outputs_[micro]}, {output_grads_[micro]});
  }
  outputs_[micro] = torch::Tensor();
  output_grads_[micro] = torch::Tensor();
  --in_flight_;
}

void PipelineEngine::keep_sending(PipeOp op, int micro, Handle handle, torch::Tensor tensor) {
  sends_.push_back({op, micro, std::move(handle), std::move(tensor)});
}

void PipelineEngine::release_sends(PipeOp op, int up_to) {
  auto done = [&](PendingSend& send) {
    if (send.op != op || send.micro > up_to) return false;
    wait_idle(send.handle);
    return true;
  };
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(), done), sends_.end());
}

void PipelineEngine::send_activation(int micro) {
  auto out = outputs_[micro].detach().contiguous();
  if (out.dim() > kMaxDims) {
    throw std::invalid_argument("pipeline: stage " + std::to_string(stage()) + " passes an activation of " +
                                std::to_string(out.dim()) + " dimensions; at most " + std::to_string(kMaxDims));
  }
  auto header = torch::zeros({kHeader}, torch::TensorOptions().dtype(torch::kLong).device(out.device()));
  std::vector<int64_t> values{static_cast<int64_t>(out.scalar_type()), out.dim()};
  for (int64_t d = 0; d < out.dim(); ++d) values.push_back(out.size(d));
  header.narrow(0, 0, static_cast<int64_t>(values.size())).copy_(torch::tensor(values, torch::kLong));
  auto& pipe = *groups_.pipe;
  keep_sending(PipeOp::kSendActivation, micro, pipe.send(header, stage() + 1, kActivationTag), header);
  keep_sending(PipeOp::kSendActivation, micro, pipe.send(out, stage() + 1, kActivationTag), out);
}

void PipelineEngine::recv_activation(int micro) {
  auto& pipe = *groups_.pipe;
  auto header = torch::empty({kHeader}, torch::TensorOptions().dtype(torch::kLong).device(device_));
  auto received = pipe.recv(header, stage() - 1, kActivationTag);
  wait_idle(received);
  const auto h = header.to(torch::kCPU);
  const auto* v = h.data_ptr<int64_t>();
  if (v[1] < 0 || v[1] > kMaxDims) {
    throw std::runtime_error("pipeline: stage " + std::to_string(stage()) + " received an activation header of " +
                             std::to_string(v[1]) + " dimensions from stage " + std::to_string(stage() - 1));
  }
  std::vector<int64_t> shape(v + 2, v + 2 + v[1]);
  auto x = torch::empty(shape, torch::TensorOptions()
                                   .dtype(static_cast<torch::ScalarType>(v[0]))
                                   .device(device_));
  received = pipe.recv(x, stage() - 1, kActivationTag);
  wait_idle(received);
  if (x.is_floating_point()) x.requires_grad_(true);
  inputs_[micro] = x;
  // The previous stage (warm-up p − s) sends activation k + p − s + 1 only after it has received gradient k, so
  // the gradients this stage sent for micro-batches up to micro − (p − s) − 1 have arrived.
  release_sends(PipeOp::kSendGrad, micro - (stages() - stage()) - 1);
}

void PipelineEngine::send_grad(int micro) {
  auto& input = inputs_[micro];
  auto grad = input.grad().defined() ? input.grad().contiguous() : torch::zeros_like(input);
  keep_sending(PipeOp::kSendGrad, micro, groups_.pipe->send(grad, stage() - 1, kGradTag), grad);
  input = torch::Tensor();
}

void PipelineEngine::recv_grad(int micro) {
  auto grad = torch::empty_like(outputs_[micro], torch::MemoryFormat::Contiguous);
  auto received = groups_.pipe->recv(grad, stage() + 1, kGradTag);
  wait_idle(received);
  output_grads_[micro] = grad;
  // A gradient for micro-batch `micro` means its activation arrived: that send is complete.
  release_sends(PipeOp::kSendActivation, micro);
}

void PipelineEngine::reduce_tied_grads() {
  std::vector<Handle> pending;
  for (auto& tie : tie_groups_) {
    for (auto& param : tie.params) {
      auto grad = param.grad();
      if (!grad.defined()) continue;
      pending.push_back(tie.comm->all_reduce(grad, ReduceOp::kSum));
    }
  }
  for (auto& h : pending) h.wait();
}

double PipelineEngine::train_batch(const std::function<MicroBatch(int micro)>& micro_batch) {
  const int m = config_.batch.grad_accum;
  inputs_.assign(m, torch::Tensor());
  outputs_.assign(m, torch::Tensor());
  output_grads_.assign(m, torch::Tensor());
  in_flight_ = 0;
  stats_ = PipeStepStats{};
  const auto start = std::chrono::steady_clock::now();
  if (CpuMemoryTracker::installed()) {
    memory_base_ = CpuMemoryTracker::allocated();
    CpuMemoryTracker::reset_peak();
    stats_.activation_peak = 0;
  }
  for (const auto& instruction : schedule_) {
    const int micro = instruction.micro;
    switch (instruction.op) {
      case PipeOp::kRecvActivation: recv_activation(micro); break;
      case PipeOp::kForward:
        forward(micro, is_first_stage() || is_last_stage() ? micro_batch(micro) : MicroBatch{});
        break;
      case PipeOp::kSendActivation: send_activation(micro); break;
      case PipeOp::kRecvGrad: recv_grad(micro); break;
      case PipeOp::kBackward:
        backward(micro);
        // Every micro-step ends with Engine::step; the last one, the boundary, waits for the tied gradients.
        if (micro != m - 1) engine_->step();
        break;
      case PipeOp::kSendGrad: send_grad(micro); break;
    }
  }
  release_sends(PipeOp::kSendActivation, m);
  release_sends(PipeOp::kSendGrad, m);
  sample_memory();
  stats_.batch_s = seconds_since(start);
  reduce_tied_grads();
  engine_->step();
  return engine_->last_step().loss;
}

}  // namespace dscpp
