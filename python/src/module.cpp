// dscpp._C: the C++ engine as Python sees it. Only translation lives here — Python tensors in as the model's own
// at::Tensors (ModelTensors), torch.distributed's process group in as the engine's comm, JSON text across for
// configs and client state, C++ exceptions out as Python ones. The training step itself is the C++ Engine's.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/extension.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dscpp/checkpoint/manifest.h"
#include "dscpp/comm/comm.h"
#include "dscpp/config/config.h"
#include "dscpp/engine/engine.h"
#include "dscpp/engine/partitioned_init.h"
#include "dscpp/monitor/memory_tracker.h"
#include "dscpp/optim/cpu_adam.h"

namespace py = pybind11;

namespace dscpp::python {
namespace {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;
using Units = std::vector<std::pair<std::string, std::vector<torch::Tensor>>>;

std::vector<NamedTensor> named(const NamedTensors& items) {
  std::vector<NamedTensor> out;
  for (const auto& [name, tensor] : items) out.push_back({name, tensor});
  return out;
}

// How the engine reaches its peers: torch.distributed's default group when the program (or init_distributed) made
// one, else one process alone.
std::shared_ptr<Comm> comm_from(const py::object& group, const py::object& store, const std::string& backend,
                                const std::string& key_prefix) {
  if (group.is_none()) return make_single_process_comm();
  return make_comm_over(group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>(),
                        store.cast<c10::intrusive_ptr<c10d::Store>>(), backend, key_prefix);
}

// `group_size`: the engine's data-parallel group's. With sequence_parallel_size P the group holds P ranks per
// sequence, and the batch triangle's data-parallel size is group_size / P (a P that does not divide it is refused
// when the engine checks the batch).
Config parse_config(const std::string& config, bool config_is_path, int group_size) {
  const std::string text = config_is_path ? Config::read_file(config) : config;
  const int sequence = read_parallel_sizes(nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false)).sequence;
  ConfigOptions options;
  options.world_size = group_size % sequence == 0 ? group_size / sequence : group_size;
  return Config::from_string(text, options, config_is_path ? config : "");
}

using UnitHandles = std::vector<std::shared_ptr<PrepartitionedUnit>>;

// The model as dscpp.initialize hands it over: its tensors (ModelTensors, but for zero.Init's units) and the handles
// of the units zero.Init built partitioned, which create_engine takes over only once the config has parsed (a bad
// config leaves the partitioned model as it was).
struct PyModel {
  ModelTensors tensors;
  UnitHandles prepartitioned;
};

// Builds the engine (dscpp.initialize's last step): `config` is JSON text, or a file's path with `config_is_path`;
// `options` carries the comm and everything else the Python side decided (its InitOptions binding, below).
std::unique_ptr<Engine> create_engine(PyModel& model, const std::string& config, bool config_is_path,
                                      InitOptions options) {
  if (!options.comm) options.comm = make_single_process_comm();
  Config parsed = parse_config(config, config_is_path, options.comm->world_size());
  ModelTensors tensors = std::move(model.tensors);
  // Handed over: the Python handles are left empty (their parameters are the engine's now).
  for (const auto& unit : model.prepartitioned) {
    tensors.prepartitioned.push_back(std::exchange(*unit, PrepartitionedUnit{}));
  }
  py::gil_scoped_release no_gil;  // collectives: other Python threads may run meanwhile
  return initialize(std::move(tensors), parsed, std::move(options));
}

// dscpp.zero.Init's C++ half: the config's dtype and persistence threshold, and a comm over torch.distributed's
// group (or one process alone).
std::shared_ptr<PartitionedInit> create_partitioned_init(const std::string& config, bool config_is_path,
                                                         const py::object& group, const py::object& store,
                                                         const std::string& backend, const std::string& key_prefix) {
  auto comm = comm_from(group, store, backend, key_prefix);
  return std::make_shared<PartitionedInit>(parse_config(config, config_is_path, comm->world_size()), comm);
}

// dscpp.ops.adam.DeepSpeedCPUAdam's step for one parameter: the SIMD CPU Adam over its fp32 tensors, in place.
void cpu_adam(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq,
              const AdamStepConfig& config) {
  for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (!t->device().is_cpu() || t->scalar_type() != torch::kFloat32 || !t->is_contiguous() ||
        t->numel() != param.numel()) {
      throw std::invalid_argument("DeepSpeedCPUAdam: parameters, gradients and states must be contiguous fp32 CPU "
                                  "tensors of one size; got " + std::string(c10::toString(t->scalar_type())) + " " +
                                  t->device().str() + " with " + std::to_string(t->numel()) + " elements for a " +
                                  std::to_string(param.numel()) + "-element parameter");
    }
  }
  cpu_adam_step(config, param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                exp_avg_sq.data_ptr<float>(), param.numel());
}

py::dict step_report(const StepReport& r) {
  py::dict d;
  d["step"] = r.step;
  d["loss"] = r.loss;
  d["lr"] = r.lr;
  d["loss_scale"] = r.loss_scale;
  d["grad_norm"] = r.grad_norm;
  d["skipped"] = r.skipped;
  return d;
}

}  // namespace

void bind_compression(py::module_& m);  // compression.cpp
void bind_sparse_attention(py::module_& m);  // sparse_attention.cpp
void bind_moe(py::module_& m);       // moe.cpp
void bind_parallel(py::module_& m);  // parallel.cpp
void bind_schedule(py::module_& m);  // schedule.cpp
void bind_sequence(py::module_& m);  // sequence.cpp
}  // namespace dscpp::python

PYBIND11_MODULE(_C, m) {
  using namespace dscpp;
  using namespace dscpp::python;
  m.doc() = "deepspeed.cpp's C++ engine; use the dscpp package, not this module";

  // Python exceptions a caller can catch by kind; the message is the C++ one, which names the key or file.
  static py::exception<ConfigError> config_error(m, "ConfigError", PyExc_ValueError);
  static py::exception<CheckpointError> checkpoint_error(m, "CheckpointError", PyExc_RuntimeError);
  static py::exception<CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ConfigError& e) {
      py::set_error(config_error, e.what());
    } catch (const CheckpointError& e) {
      py::set_error(checkpoint_error, e.what());
    } catch (const CommError& e) {
      py::set_error(comm_error, e.what());
    }
  });

  // A comm over a torch.distributed group, held by Python for what it hands to C++ more than once (an MoE layer's
  // expert-parallel group, the expert-data-parallel group).
  py::class_<Comm, std::shared_ptr<Comm>>(m, "Comm")
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("world_size", &Comm::world_size);
  m.def("comm_over", &comm_from, py::arg("group"), py::arg("store"), py::arg("backend"), py::arg("key_prefix"),
        "A Comm over torch.distributed's `group` (None: one process alone); see dscpp.comm.engine_comm_arguments.");
  bind_compression(m);
  bind_sparse_attention(m);
  // What CPU tensors hold, counted as the memory breakdown counts it (benchmarks measure activations with it).
  py::module_ memory = m.def_submodule("memory", "The engine's count of the bytes CPU tensors hold");
  memory.def("install", &CpuMemoryTracker::install, "Counts CPU tensors allocated from now on (once per process).");
  memory.def("allocated", &CpuMemoryTracker::allocated, "Bytes counted CPU tensors hold now.");
  memory.def("peak", &CpuMemoryTracker::peak, "The most held at once since install or reset_peak.");
  memory.def("reset_peak", &CpuMemoryTracker::reset_peak, "peak = allocated now.");
  bind_moe(m);
  bind_parallel(m);
  bind_schedule(m);
  bind_sequence(m);

  py::class_<Engine>(m, "Engine")
      .def("begin_forward", &Engine::begin_forward)
      .def("end_forward", &Engine::end_forward, py::arg("will_backward"))
      .def("backward", &Engine::backward, py::arg("loss"), py::call_guard<py::gil_scoped_release>())
      .def("step", &Engine::step, py::call_guard<py::gil_scoped_release>())
      .def("enter_unit", &Engine::enter_unit, py::arg("unit"), py::call_guard<py::gil_scoped_release>())
      .def("leave_unit", &Engine::leave_unit, py::arg("unit"), py::arg("outputs"),
           py::call_guard<py::gil_scoped_release>())
      .def("fetch_param", &Engine::fetch_param, py::arg("param"), py::call_guard<py::gil_scoped_release>())
      .def("whole_parameter", &Engine::whole_parameter, py::arg("param"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("param_shapes",
                             [](const Engine& e) {
                               // Trainable and frozen: DeepSpeed's ds_shape holds for every ZeRO-3 parameter.
                               std::map<std::string, std::vector<int64_t>> shapes;
                               for (const auto& p : e.param_entries()) shapes.emplace(p.name, p.shape);
                               for (const auto& p : e.frozen_entries()) shapes.emplace(p.name, p.shape);
                               return shapes;
                             })
      .def(
          "set_parameters",
          [](Engine& e, const std::map<std::string, torch::Tensor>& values) {
            // Frozen ones into their shards (or themselves), the trainable ones through the master.
            std::map<std::string, torch::Tensor> trained = values;
            for (const auto& p : e.frozen_entries()) {
              auto it = trained.find(p.name);
              if (it == trained.end()) continue;
              e.write_frozen(p.name, it->second);
              trained.erase(it);
            }
            e.write_own_weights([&](const std::string& name, const std::vector<int64_t>&) { return trained.at(name); },
                                [&](const std::string& name) { return trained.count(name) > 0; });
          },
          py::arg("values"), py::call_guard<py::gil_scoped_release>())
      .def(
          "checkpoint",
          [](Engine& e, py::function block, const std::vector<torch::Tensor>& inputs) {
            // The block runs now (GIL held) and again during backward, where the engine runs without the GIL; the
            // autograd graph keeps it and may drop it without the GIL too, so its last reference takes the GIL.
            std::shared_ptr<py::function> held(new py::function(std::move(block)), [](py::function* f) {
              py::gil_scoped_acquire gil;
              delete f;
            });
            auto run = [held](const std::vector<torch::Tensor>& xs) {
              py::gil_scoped_acquire gil;
              return (*held)(xs).cast<std::vector<torch::Tensor>>();
            };
            return e.checkpoint(ActivationCheckpointing::ListBlock(run), inputs);
          },
          py::arg("block"), py::arg("inputs"))
      .def("is_gradient_accumulation_boundary", &Engine::is_gradient_accumulation_boundary)
      .def("set_gradient_accumulation_boundary", &Engine::set_gradient_accumulation_boundary, py::arg("is_boundary"))
      .def_property_readonly("rank", &Engine::rank)
      .def_property_readonly("world_size", &Engine::world_size)
      .def_property_readonly("zero_stage", [](const Engine& e) { return e.config().zero.stage; })
      .def_property_readonly("micro_batch", [](const Engine& e) { return e.config().batch.micro_batch; })
      .def_property_readonly("sequence_parallel_size",
                             [](const Engine& e) { return e.config().sequence_parallel_size; })
      .def_property_readonly("grad_accum", [](const Engine& e) { return e.config().batch.grad_accum; })
      .def_property_readonly("train_batch_size", [](const Engine& e) { return e.config().batch.train_batch_size; })
      .def_property_readonly("compute_dtype",
                             [](const Engine& e) { return std::string(c10::toString(e.compute_dtype())); })
      .def_property_readonly("config_json", [](const Engine& e) { return e.config().resolved.dump(); })
      .def_property_readonly("hybrid_engine",
                             [](const Engine& e) {
                               // The parsed section (defaults filled in), for dscpp.runtime.hybrid_engine.
                               const HybridEngineConfig& h = e.config().hybrid_engine;
                               py::dict d;
                               d["enabled"] = h.enabled;
                               d["pin_parameters"] = h.pin_parameters;
                               d["inference_tp_size"] = h.inference_tp_size;
                               return d;
                             })
      .def_property_readonly("comm_totals",
                             [](const Engine& e) {
                               // {op: (calls, message bytes)} of the data-parallel collectives so far; None when the
                               // comms_logger is off.
                               py::object none = py::none();
                               const CommsLogger* logger = e.comms_logger();
                               if (logger == nullptr) return none;
                               py::dict d;
                               for (const auto& [op, sizes] : logger->stats()) {
                                 int64_t calls = 0, bytes = 0;
                                 for (const auto& [size, stats] : sizes) {
                                   calls += stats.count;
                                   bytes += stats.bytes;
                                 }
                                 d[py::str(op)] = py::make_tuple(calls, bytes);
                               }
                               return py::object(d);
                             })
      .def_property_readonly("global_steps", &Engine::global_steps)
      .def_property_readonly("micro_steps", &Engine::micro_steps)
      .def_property_readonly("skipped_steps", &Engine::skipped_steps)
      .def_property_readonly("global_samples", &Engine::global_samples)
      .def_property_readonly("lr", &Engine::lr)
      .def("set_lr", &Engine::set_lr, py::arg("lr"))
      .def("set_group_lr", &Engine::set_group_lr, py::arg("group"), py::arg("lr"))
      .def_property_readonly("group_lrs", &Engine::group_lrs)
      .def_property_readonly("loss_scale", &Engine::loss_scale)
      .def("last_step", [](const Engine& e) { return step_report(e.last_step()); })
      .def_property_readonly("memory_json", [](const Engine& e) { return to_json(e.memory()).dump(); })
      .def(
          "save_checkpoint",
          [](Engine& e, const std::string& dir, const std::string& tag, const std::string& client_state,
             bool save_latest, bool exclude_frozen_parameters) {
            CheckpointSaveOptions options;
            options.save_latest = save_latest;
            options.exclude_frozen_parameters = exclude_frozen_parameters;
            return e.save_checkpoint(dir, tag, nlohmann::json::parse(client_state), options);
          },
          py::arg("save_dir"), py::arg("tag"), py::arg("client_state_json"), py::arg("save_latest"),
          py::arg("exclude_frozen_parameters"), py::call_guard<py::gil_scoped_release>())
      .def(
          "load_checkpoint",
          [](Engine& e, const std::string& dir, const std::string& tag, bool load_optimizer_states,
             bool load_lr_scheduler_states, bool load_module_only, bool load_module_strict) {
            CheckpointLoadOptions options;
            options.load_optimizer_states = load_optimizer_states;
            options.load_lr_scheduler_states = load_lr_scheduler_states;
            options.load_module_only = load_module_only;
            options.load_module_strict = load_module_strict;
            const auto loaded = e.load_checkpoint(dir, tag, options);
            return std::make_tuple(loaded.path, loaded.tag, loaded.client_state.dump());
          },
          py::arg("load_dir"), py::arg("tag"), py::arg("load_optimizer_states"), py::arg("load_lr_scheduler_states"),
          py::arg("load_module_only"), py::arg("load_module_strict"), py::call_guard<py::gil_scoped_release>())
      .def("save_16bit_model", &Engine::save_16bit_model, py::arg("path"), py::call_guard<py::gil_scoped_release>());

  m.def(
      "cpu_adam_step",
      [](torch::Tensor param, const torch::Tensor& grad, torch::Tensor exp_avg, torch::Tensor exp_avg_sq, double lr,
         double beta1, double beta2, double eps, double weight_decay, bool decoupled, bool bias_correction,
         int64_t step) {
        cpu_adam(param, grad, exp_avg, exp_avg_sq,
                 AdamStepConfig{lr, beta1, beta2, eps, weight_decay, decoupled, bias_correction, step});
      },
      py::arg("param"), py::arg("grad"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("lr"), py::arg("beta1"),
      py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("decoupled"), py::arg("bias_correction"),
      py::arg("step"), py::call_guard<py::gil_scoped_release>());
  m.def("simd_path", [] { return to_string(best_simd_path()); });

  py::class_<PrepartitionedUnit, std::shared_ptr<PrepartitionedUnit>>(m, "PrepartitionedUnit")
      .def_property_readonly("params", [](const PrepartitionedUnit& u) { return u.params; })
      .def_property_readonly("whole", [](const PrepartitionedUnit& u) { return u.whole; })
      .def_property_readonly("shard_numel", [](const PrepartitionedUnit& u) {
        return u.shard.defined() ? u.shard.numel() : int64_t{0};
      });
  py::class_<PartitionedInit, std::shared_ptr<PartitionedInit>>(m, "PartitionedInit")
      .def(
          "partition",
          [](PartitionedInit& init, const NamedTensors& params) -> std::shared_ptr<PrepartitionedUnit> {
            auto unit = init.partition_params(params);
            if (unit.params.empty()) return nullptr;
            return std::make_shared<PrepartitionedUnit>(std::move(unit));
          },
          py::arg("params"), py::call_guard<py::gil_scoped_release>())
      .def(
          "gather", [](PartitionedInit& init, PrepartitionedUnit& unit) { gather_whole(unit, *init.comm()); },
          py::arg("unit"), py::call_guard<py::gil_scoped_release>())
      .def(
          "repartition",
          [](PartitionedInit& init, PrepartitionedUnit& unit, int modifier_rank) {
            repartition(unit, *init.comm(), modifier_rank);
          },
          py::arg("unit"), py::arg("modifier_rank"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("dtype", [](const PartitionedInit& init) { return std::string(c10::toString(init.dtype())); });
  m.def("create_partitioned_init", &create_partitioned_init, py::arg("config"), py::arg("config_is_path"),
        py::arg("group"), py::arg("store"), py::arg("backend"), py::arg("key_prefix"),
        "The C++ half of dscpp.zero.Init.");

  py::class_<PyModel>(m, "ModelTensors", "A model's tensors for create_engine (include/dscpp/engine/model_tensors.h).")
      .def(py::init([](const NamedTensors& params, const NamedTensors& buffers,
                       const std::set<std::string>& non_persistent_buffers, const Units& units,
                       const UnitHandles& prepartitioned) {
             PyModel model{{named(params), named(buffers), non_persistent_buffers, {}, {}}, prepartitioned};
             for (const auto& [name, unit_params] : units) model.tensors.units.push_back({name, unit_params});
             return model;
           }),
           py::arg("params"), py::arg("buffers"), py::arg("non_persistent_buffers"), py::arg("units"),
           py::arg("prepartitioned"));
  // The InitOptions fields the Python front end decides (include/dscpp/engine/init_options.h says what each does); the
  // others keep their defaults. Unset comm: one process alone.
  py::class_<InitOptions>(m, "InitOptions")
      .def(py::init<>())
      .def_readwrite("comm", &InitOptions::comm)
      .def_property(
          "param_groups",
          [](const InitOptions& o) {
            std::vector<std::tuple<std::vector<std::string>, std::optional<double>, std::optional<double>>> out;
            for (const auto& g : o.param_groups) out.emplace_back(g.params, g.weight_decay, g.lr);
            return out;
          },
          [](InitOptions& o,
             const std::vector<std::tuple<std::vector<std::string>, std::optional<double>, std::optional<double>>>&
                 groups) {  // (parameter names, weight_decay or None, lr or None) per group
            o.param_groups.clear();
            for (const auto& [names, weight_decay, lr] : groups) o.param_groups.push_back({names, weight_decay, lr});
          })
      .def_readwrite("model_parallel_group", &InitOptions::model_parallel_group)
      .def_readwrite("model_parallel_params", &InitOptions::model_parallel_params)
      .def_readwrite("untrained_params", &InitOptions::untrained_params)
      .def_readwrite("forward_only", &InitOptions::forward_only)
      .def_readwrite("compression_applied", &InitOptions::compression_applied)
      .def_readwrite("sparse_attention_applied", &InitOptions::sparse_attention_applied)
      .def_readwrite("expert_data_parallel_group", &InitOptions::expert_data_parallel_group)
      .def_readwrite("expert_params", &InitOptions::expert_params);
  m.def("create_engine", &create_engine, py::arg("model"), py::arg("config"), py::arg("config_is_path"),
        py::arg("options"), "Builds the engine over a model's tensors (see dscpp.initialize).");
}
