// DeepSpeed's checkpoint layouts, read (see deepspeed_checkpoint.h). What each file holds is DeepSpeed's
// (runtime/engine.py's _save_checkpoint and _save_zero_checkpoint; its zero_to_fp32.py reassembles the same
// partitions); the names below are its keys.
#include "dscpp/checkpoint/deepspeed_checkpoint.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/checkpoint/torch_pickle.h"

namespace fs = std::filesystem;

namespace dscpp {

namespace {

using Kind = PyValue::Kind;

// The model-states keys DeepSpeed's engine writes itself; every other key is the client state the script passed.
const std::set<std::string> kEngineKeys = {
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
    "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
    "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
    "checkpoint_parallel_dimensions", "universal_checkpoint_info"};

// Model-states keys that mean a run this reader does not convert yet (when set): refused, naming them.
const std::vector<std::pair<std::string, std::string>> kUnsupportedKeys = {
    {"data_sampler", "DeepSpeed's data-efficiency sampler state, which our engine does not have (the data position it "
                     "carries would be lost)"},
    {"random_ltd", "DeepSpeed's random layer-token-drop state, which our engine does not have"},
    {"num_experts", "a DeepSpeed-MoE run (its experts' files are not converted yet)"},
    {"ds_autoep_layers", "a DeepSpeed AutoEP run (its experts' partitions are not converted yet)"},
    {"ds_zero_partition_groups", "ZeRO partitioned over groups smaller than the data-parallel world"},
};

// Adam's and AdamW's state, as DeepSpeed's optimizers and torch's name it and as ours do.
const std::vector<std::string> kAdamState = {"exp_avg", "exp_avg_sq"};

PyRef load(const std::string& path) {
  try {
    return load_torch_file(path);
  } catch (const std::runtime_error& e) {
    throw CheckpointError(e.what());
  }
}

// A plain value as JSON (the config, the client state). `where` names it in the error for a tensor or an object.
nlohmann::json to_json(const PyValue& v, const std::string& where) {
  switch (v.kind) {
    case Kind::kNone: return nullptr;
    case Kind::kBool: return v.boolean;
    case Kind::kInt: return v.integer;
    case Kind::kFloat: return v.real;
    case Kind::kString: return v.text;
    case Kind::kList:
    case Kind::kTuple: {
      auto out = nlohmann::json::array();
      for (size_t i = 0; i < v.items.size(); ++i) out.push_back(to_json(*v.items[i], where + "[" + std::to_string(i) + "]"));
      return out;
    }
    case Kind::kDict: {
      auto out = nlohmann::json::object();
      for (const auto& [k, value] : v.entries) {
        std::string key;
        if (k->kind == Kind::kString) {
          key = k->text;
        } else if (k->kind == Kind::kInt) {
          key = std::to_string(k->integer);
        } else {
          throw CheckpointError(where + ": a key of type " + k->kind_name() + " has no JSON form");
        }
        out[key] = to_json(*value, where + "." + key);
      }
      return out;
    }
    default:
      throw CheckpointError(where + " is a " + v.kind_name() +
                            ": our checkpoints carry a client state of JSON values only (numbers, strings, lists, "
                            "dicts)");
  }
}

std::vector<int64_t> shape_of(const PyValue& size, const std::string& where) {
  std::vector<int64_t> shape;
  for (const auto& d : size.as_sequence(where)) shape.push_back(d->as_int(where));
  return shape;
}

// An OrderedDict name → torch.Size, in order.
std::vector<ParamEntry> shapes_of(const PyValue& dict, const std::string& where) {
  if (dict.kind != Kind::kDict) throw CheckpointError(where + ": expected a dict, found " + dict.kind_name());
  std::vector<ParamEntry> out;
  for (const auto& [k, size] : dict.entries) {
    const auto& name = k->as_string(where);
    out.push_back({name, shape_of(*size, where + "['" + name + "']")});
  }
  return out;
}

torch::Tensor flat_fp32(const PyValue& v, const std::string& where) {
  return v.as_tensor(where).reshape({-1}).to(torch::kFloat32);
}

// torch's and DeepSpeed's optimizers keep `step` as an int or a one-element tensor.
int64_t step_of(const PyValue& state, const std::string& where) {
  const auto& step = state.at("step", where);
  if (step.kind == Kind::kTensor) return static_cast<int64_t>(step.tensor.item<double>());
  if (step.kind == Kind::kFloat) return static_cast<int64_t>(step.real);
  return step.as_int(where + "['step']");
}

// The files of one tag and what they say about the run.
struct Tag {
  std::string dir;
  PyRef model_states;               // rank 0's
  PyRef optim0;                     // rank 0's optimizer states (read once: they can be large)
  std::vector<std::string> optim;   // zero_pp_rank_R_mp_rank_00_optim_states.pt, by rank
  std::vector<std::string> models;  // ZeRO 3: zero_pp_rank_R_mp_rank_00_model_states.pt, by rank
  int world_size = 1;
  // DeepSpeed's universal format (ds_to_universal): zero/<parameter>/{fp32,exp_avg,exp_avg_sq,step}.pt, whole, and
  // zero/optimizer_state.pt (the loss scaler) instead of per-rank optimizer files.
  bool universal = false;
  PyRef universal_optimizer;
};

// `prefix`: DeepSpeed names a bf16 run's optimizer files bf16_zero_pp_rank_..., the same layout.
std::string rank_file(const std::string& dir, int rank, const char* what, const std::string& prefix = "") {
  return (fs::path(dir) / (prefix + "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_" + what + ".pt")).string();
}

Tag open_tag(const std::string& dir) {
  Tag t;
  t.dir = dir;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto name = entry.path().filename().string();
    if (name.rfind("layer_", 0) == 0) {
      throw CheckpointError(entry.path().string() + ": a pipeline-parallel DeepSpeed checkpoint (layer files); "
                            "converting those is not supported yet");
    }
    if (name.rfind("expp_rank_", 0) == 0 || name.find("expert_") != std::string::npos) {
      throw CheckpointError(entry.path().string() + ": a DeepSpeed-MoE checkpoint (expert files); converting "
                            "those is not supported yet");
    }
    if (name.find("mp_rank_") != std::string::npos && name.find("mp_rank_00") == std::string::npos) {
      throw CheckpointError(entry.path().string() + ": a tensor-parallel DeepSpeed checkpoint (mp_rank beyond 00); "
                            "converting those is not supported yet");
    }
  }
  const auto zero3_model = rank_file(dir, 0, "model_states");
  const auto plain_model = (fs::path(dir) / "mp_rank_00_model_states.pt").string();
  const bool zero3 = fs::exists(zero3_model);
  if (!zero3 && !fs::exists(plain_model)) {
    throw CheckpointError(dir + ": neither mp_rank_00_model_states.pt nor zero_pp_rank_0_mp_rank_00_model_states.pt: "
                          "not a DeepSpeed checkpoint tag");
  }
  t.model_states = load(zero3 ? zero3_model : plain_model);
  const auto& ms = *t.model_states;
  const std::string where = zero3 ? zero3_model : plain_model;
  if (const auto* mp = ms.find("mp_world_size"); mp && mp->as_int(where) != 1) {
    throw CheckpointError(where + ": mp_world_size " + std::to_string(mp->as_int(where)) +
                          " (tensor parallel); converting those is not supported yet");
  }
  t.world_size = static_cast<int>(ms.at("dp_world_size", where).as_int(where + "['dp_world_size']"));
  if (t.world_size < 1) throw CheckpointError(where + ": dp_world_size " + std::to_string(t.world_size));
  t.universal = fs::is_directory(fs::path(dir) / "zero");
  if (zero3) {
    for (int r = 0; r < t.world_size; ++r) t.models.push_back(rank_file(dir, r, "model_states"));
  }
  if (t.universal) {
    t.universal_optimizer = load((fs::path(dir) / "zero" / "optimizer_state.pt").string());
    return t;
  }
  const std::string prefix = fs::exists(rank_file(dir, 0, "optim_states", "bf16_")) ? "bf16_" : "";
  for (int r = 0; r < t.world_size; ++r) {
    const auto optim = rank_file(dir, r, "optim_states", prefix);
    if (fs::exists(optim)) t.optim.push_back(optim);
  }
  if (!t.optim.empty() && static_cast<int>(t.optim.size()) != t.world_size) {
    throw CheckpointError(rank_file(dir, static_cast<int>(t.optim.size()), "optim_states", prefix) +
                          ": missing (dp_world_size is " + std::to_string(t.world_size) + ")");
  }
  if (!t.optim.empty()) t.optim0 = load(t.optim[0]);
  return t;
}

// Master weights and optimizer state, whole, by parameter name; `order` the trainable parameters as the optimizer
// flattened them.
struct Trained {
  std::vector<ParamEntry> order;
  std::map<std::string, torch::Tensor> master;
  std::map<std::string, std::map<std::string, torch::Tensor>> state;  // kind → name → whole
  int64_t step = 0;
};

// The optimizer file's partition_count (an int at ZeRO 3, one per group at 1 and 2) must be the world the files
// were written by: a ZeRO partitioned over smaller groups lays its buffers out otherwise.
void check_partition_count(const PyValue& osd, int world, const std::string& where) {
  const auto* count = osd.find("partition_count");
  if (!count) return;
  std::vector<int64_t> counts;
  if (count->kind == Kind::kInt) {
    counts.push_back(count->integer);
  } else {
    for (const auto& c : count->as_sequence(where + " partition_count")) counts.push_back(c->as_int(where));
  }
  for (auto c : counts) {
    if (c != world) {
      throw CheckpointError(where + ": partitioned over " + std::to_string(c) + " ranks, not dp_world_size " +
                            std::to_string(world) + " (ZeRO over smaller groups: not supported yet)");
    }
  }
}

// Splits `flat` (one group, whole) into `params`' tensors, in order, skipping each one's alignment padding. The
// parameters must use the buffer up to DeepSpeed's padding of the group (to a multiple of 2 x world, as its
// zero_to_fp32 checks): anything else is a layout this reader does not know, not one to read at wrong offsets.
void split_group(const torch::Tensor& flat, const std::vector<ParamEntry>& params, const std::vector<int64_t>& pads,
                 int world, std::map<std::string, torch::Tensor>& out, const std::string& where) {
  int64_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto numel = params[i].numel();
    if (offset + numel > flat.numel()) {
      throw CheckpointError(where + ": the partitions hold " + std::to_string(flat.numel()) + " elements, fewer than "
                            "the parameters they should hold (at '" + params[i].name + "')");
    }
    out[params[i].name] = flat.narrow(0, offset, numel).clone();
    offset += numel + (i < pads.size() ? pads[i] : 0);
  }
  const int64_t align = 2 * static_cast<int64_t>(world);
  const auto aligned = [&](int64_t x) { return (x + align - 1) / align * align; };
  if (aligned(offset) != aligned(flat.numel())) {
    throw CheckpointError(where + ": the parameters use " + std::to_string(offset) + " of the partitions' " +
                          std::to_string(flat.numel()) + " elements; DeepSpeed pads a group by less than " +
                          std::to_string(align) + " (param_shapes does not describe these buffers)");
  }
}

// ZeRO 1 and 2: per rank and param group, a partition of the group's flat fp32 buffer and of each moment.
Trained read_zero12(const Tag& t) {
  const auto& ms = *t.model_states;
  const std::string ms_where = t.dir + "/mp_rank_00_model_states.pt";
  const auto& groups = ms.at("param_shapes", ms_where).as_sequence(ms_where + "['param_shapes']");
  std::vector<PyRef> files;
  for (size_t r = 0; r < t.optim.size(); ++r) files.push_back(r == 0 ? t.optim0 : load(t.optim[r]));
  Trained out;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto params = shapes_of(*groups[g], ms_where + "['param_shapes'][" + std::to_string(g) + "]");
    std::vector<torch::Tensor> master, kinds[2];
    std::vector<int64_t> pads;
    for (size_t r = 0; r < files.size(); ++r) {
      const auto& osd = files[r]->at("optimizer_state_dict", t.optim[r]);
      const std::string where = t.optim[r] + ": optimizer_state_dict";
      master.push_back(flat_fp32(*osd.at("single_partition_of_fp32_groups", where).as_sequence(where).at(g), where));
      const auto& state = osd.at("base_optimizer_state", where).at("state", where + "['base_optimizer_state']");
      const auto* group_state = state.find(static_cast<int64_t>(g));
      if (!group_state) throw CheckpointError(where + "['base_optimizer_state']['state']: no state for group " +
                                              std::to_string(g) + " (saved before the first step?)");
      for (size_t k = 0; k < kAdamState.size(); ++k) {
        kinds[k].push_back(flat_fp32(group_state->at(kAdamState[k], where + " state"), where + " " + kAdamState[k]));
      }
      out.step = std::max(out.step, step_of(*group_state, where + " state"));
      if (r == 0) {
        check_partition_count(osd, t.world_size, where);
        if (const auto* all = osd.find("param_alignment_paddings"); all && !all->is_none()) {
          for (const auto& p : all->as_sequence(where).at(g)->as_sequence(where)) pads.push_back(p->as_int(where));
          if (pads.size() != params.size()) {
            throw CheckpointError(where + ": " + std::to_string(pads.size()) + " alignment paddings for group " +
                                  std::to_string(g) + "'s " + std::to_string(params.size()) + " parameters");
          }
        }
      }
    }
    const std::string where = t.dir + " group " + std::to_string(g);
    split_group(torch::cat(master), params, pads, t.world_size, out.master, where);
    for (size_t k = 0; k < kAdamState.size(); ++k) {
      split_group(torch::cat(kinds[k]), params, pads, t.world_size, out.state[kAdamState[k]], where);
    }
    out.order.insert(out.order.end(), params.begin(), params.end());
  }
  return out;
}

// ZeRO 3: every parameter split into world_size pieces of ceil(numel / world_size) (the last padded), each rank's
// pieces one after another in its flat buffer, across its sub-groups.
Trained read_zero3(const Tag& t) {
  const auto& ms = *t.model_states;
  const std::string ms_where = t.models[0];
  Trained out;
  for (const auto& group : ms.at("param_shapes", ms_where).as_sequence(ms_where + "['param_shapes']")) {
    const auto params = shapes_of(*group, ms_where + "['param_shapes']");
    out.order.insert(out.order.end(), params.begin(), params.end());
  }
  std::vector<torch::Tensor> master, kinds[2];
  for (size_t r = 0; r < t.optim.size(); ++r) {
    const auto file = r == 0 ? t.optim0 : load(t.optim[r]);
    const std::string where = t.optim[r] + ": optimizer_state_dict";
    const auto& osd = file->at("optimizer_state_dict", t.optim[r]);
    check_partition_count(osd, t.world_size, where);
    std::vector<torch::Tensor> pieces;
    for (const auto& sub : osd.at("fp32_flat_groups", where).as_sequence(where)) pieces.push_back(flat_fp32(*sub, where));
    master.push_back(torch::cat(pieces));
    const auto& state = osd.at("optimizer_state_dict", where).at("state", where + "['optimizer_state_dict']");
    for (size_t k = 0; k < kAdamState.size(); ++k) {
      std::vector<torch::Tensor> subs;
      for (size_t s = 0; s < pieces.size(); ++s) {
        const auto* sub_state = state.find(static_cast<int64_t>(s));
        if (!sub_state) throw CheckpointError(where + ": no optimizer state for sub-group " + std::to_string(s) +
                                              " (saved before the first step?)");
        subs.push_back(flat_fp32(sub_state->at(kAdamState[k], where), where + " " + kAdamState[k]));
        out.step = std::max(out.step, step_of(*sub_state, where));
      }
      kinds[k].push_back(torch::cat(subs));
    }
  }
  const int64_t world = t.world_size;
  const auto gather = [&](const std::vector<torch::Tensor>& ranks, std::map<std::string, torch::Tensor>& into) {
    int64_t offset = 0;
    for (const auto& p : out.order) {
      const int64_t piece = (p.numel() + world - 1) / world;
      std::vector<torch::Tensor> parts;
      for (int64_t r = 0; r < world; ++r) {
        if (offset + piece > ranks[r].numel()) {
          throw CheckpointError(t.optim[r] + ": holds " + std::to_string(ranks[r].numel()) + " elements, fewer than "
                                "its pieces of the parameters (at '" + p.name + "')");
        }
        parts.push_back(ranks[r].narrow(0, offset, piece));
      }
      into[p.name] = torch::cat(parts).narrow(0, 0, p.numel()).clone();
      offset += piece;
    }
    // DeepSpeed's pieces fill each rank's buffer exactly (zero_to_fp32 checks the same).
    for (int64_t r = 0; r < world; ++r) {
      if (ranks[r].numel() != offset) {
        throw CheckpointError(t.optim[r] + ": holds " + std::to_string(ranks[r].numel()) + " elements, its pieces " +
                              "of the parameters " + std::to_string(offset) + " (param_shapes does not describe it)");
      }
    }
  };
  gather(master, out.master);
  for (size_t k = 0; k < kAdamState.size(); ++k) gather(kinds[k], out.state[kAdamState[k]]);
  return out;
}

// The universal format: every parameter's tensors whole, in files of their own (step.pt an int).
Trained read_universal(const Tag& t) {
  const auto& ms = *t.model_states;
  const std::string ms_where = t.models.empty() ? t.dir + "/mp_rank_00_model_states.pt" : t.models[0];
  Trained out;
  for (const auto& group : ms.at("param_shapes", ms_where).as_sequence(ms_where + "['param_shapes']")) {
    const auto params = shapes_of(*group, ms_where + "['param_shapes']");
    out.order.insert(out.order.end(), params.begin(), params.end());
  }
  for (const auto& p : out.order) {
    const auto folder = fs::path(t.dir) / "zero" / p.name;
    const auto read = [&](const std::string& kind) {
      const auto path = (folder / (kind + ".pt")).string();
      const auto file = load(path);
      // {"param": tensor, "cat_dim": ...} (from ZeRO 1/2) or the tensor itself (from ZeRO 3).
      auto v = flat_fp32(file->kind == Kind::kTensor ? *file : file->at("param", path), path);
      if (v.numel() != p.numel()) {
        throw CheckpointError(path + ": " + std::to_string(v.numel()) + " elements, parameter '" + p.name + "' has " +
                              std::to_string(p.numel()) + " (a tensor-parallel slice? not supported yet)");
      }
      return v;
    };
    out.master[p.name] = read("fp32");
    for (const auto& kind : kAdamState) out.state[kind][p.name] = read(kind);
    const auto step_path = (folder / "step.pt").string();
    if (!fs::exists(step_path)) continue;
    const auto step = load(step_path);
    out.step = std::max(out.step, step->kind == Kind::kTensor ? static_cast<int64_t>(step->tensor.item<double>())
                                                              : step->as_int(step_path));
  }
  // From a ZeRO-3 checkpoint there is no step.pt: the step is in the optimizer state rank 0 saved.
  const std::string where = t.dir + "/zero/optimizer_state.pt";
  if (const auto* osd = t.universal_optimizer->find("optimizer_state_dict")) {
    if (const auto* state = osd->find("state")) {
      for (const auto& [k, sub] : state->entries) out.step = std::max(out.step, step_of(*sub, where));
    }
  }
  if (out.step == 0) throw CheckpointError(t.dir + ": no optimizer step count (step.pt, or in " + where + ")");
  return out;
}

// ZeRO 0 in fp32: the module's parameters are the master weights, and the optimizer's state_dict (torch's layout:
// state by parameter index) is in the model-states file. Its indices follow the module's trainable parameters.
Trained read_zero0(const Tag& t, const std::vector<std::string>& trainable) {
  const auto& ms = *t.model_states;
  const std::string where = t.dir + "/mp_rank_00_model_states.pt";
  const auto& optimizer = ms.at("optimizer", where);
  if (optimizer.is_none()) throw CheckpointError(where + ": no optimizer state (saved without it)");
  const auto& module = ms.at("module", where);
  // Its state names no parameters, only indices in the param groups' order: with one group holding every
  // parameter that is the module's order (what initialize(model_parameters=model.parameters()) gives); with several,
  // the order is the script's and cannot be recovered from the file.
  const auto& groups = optimizer.at("param_groups", where + "['optimizer']").as_sequence(where);
  if (groups.size() != 1) {
    throw CheckpointError(where + ": a ZeRO-0 checkpoint whose optimizer has " + std::to_string(groups.size()) +
                          " param groups: its state names no parameters, so which is which cannot be read from it; "
                          "save it from a ZeRO-1 run (whose files name every parameter) to convert it");
  }
  const int64_t indices = static_cast<int64_t>(groups[0]->at("params", where).as_sequence(where).size());
  if (indices != static_cast<int64_t>(trainable.size())) {
    throw CheckpointError(where + ": its optimizer holds " + std::to_string(indices) + " parameters and the module " +
                          std::to_string(trainable.size()) + "; a ZeRO-0 checkpoint does not name its optimizer's "
                          "parameters, so only one whose optimizer holds every parameter of the module converts");
  }
  const auto& state = optimizer.at("state", where + "['optimizer']");
  Trained out;
  for (size_t i = 0; i < trainable.size(); ++i) {
    const auto& name = trainable[i];
    const auto& value = module.at(name, where + "['module']").as_tensor(where);
    out.order.push_back({name, value.sizes().vec()});
    out.master[name] = value.reshape({-1}).to(torch::kFloat32).clone();
    const auto* s = state.find(static_cast<int64_t>(i));
    if (!s) throw CheckpointError(where + ": no optimizer state for '" + name + "' (saved before the first step?)");
    for (const auto& kind : kAdamState) {
      const auto& v = s->at(kind, where).as_tensor(where + " " + kind);
      if (v.sizes() != value.sizes()) {
        throw CheckpointError(where + ": the optimizer's " + kind + " #" + std::to_string(i) + " is " +
                              c10::str(v.sizes()) + ", parameter '" + name + "' " + c10::str(value.sizes()) +
                              " (its parameters are not in the module's order)");
      }
      out.state[kind][name] = v.reshape({-1}).to(torch::kFloat32).clone();
    }
    out.step = std::max(out.step, step_of(*s, where));
  }
  return out;
}

// Frozen parameters, whole: at ZeRO 3 in pieces across the ranks' model-states files, else in the module. DeepSpeed
// lists them (frozen_param_shapes) from ZeRO 2 on; below, they are the module's parameters that are neither buffers
// nor in param_shapes. `trained` names every parameter the optimizer holds (param_shapes), `skip` buffers and tied
// aliases.
std::map<std::string, torch::Tensor> read_frozen(const Tag& t, const std::set<std::string>& trained,
                                                 const std::set<std::string>& skip) {
  std::map<std::string, torch::Tensor> out;
  const auto& ms = *t.model_states;
  const auto& module = ms.at("module", t.dir);
  const auto* frozen = ms.find("frozen_param_shapes");
  std::vector<ParamEntry> shapes;
  if (frozen && !frozen->is_none()) {
    shapes = shapes_of(*frozen, t.dir + " frozen_param_shapes");
  } else if (!trained.empty()) {
    for (const auto& [k, v] : module.entries) {
      const auto& name = k->as_string(t.dir);
      if (!trained.count(name) && !skip.count(name)) shapes.push_back({name, v->as_tensor(t.dir).sizes().vec()});
    }
  }
  // ZeRO 3 keeps each rank's piece of a frozen parameter in that rank's model states (frozen_param_fragments);
  // elsewhere, and in a universal checkpoint written by our exporter, the module holds it whole.
  const auto* fragments = ms.find("frozen_param_fragments");
  if (t.models.empty() || !fragments || fragments->is_none()) {
    for (const auto& p : shapes) {
      const auto& value = module.at(p.name, t.dir + " module").as_tensor(t.dir);
      if (value.sizes().vec() != p.shape) {
        throw CheckpointError(t.dir + ": frozen parameter '" + p.name + "' is " + c10::str(value.sizes()) +
                              " in the module, " + c10::str(c10::IntArrayRef(p.shape)) + " in frozen_param_shapes");
      }
      out[p.name] = value.clone();
    }
    return out;
  }
  std::vector<PyRef> ranks;
  for (const auto& path : t.models) ranks.push_back(load(path));
  for (const auto& p : shapes) {
    std::vector<torch::Tensor> parts;
    for (size_t r = 0; r < ranks.size(); ++r) {
      parts.push_back(ranks[r]->at("frozen_param_fragments", t.models[r]).at(p.name, t.models[r]).as_tensor(
          t.models[r]).reshape({-1}));
    }
    auto whole = torch::cat(parts);
    if (whole.numel() < p.numel()) {
      throw CheckpointError(t.dir + ": the ranks' pieces of frozen parameter '" + p.name + "' hold " +
                            std::to_string(whole.numel()) + " elements, fewer than its " + std::to_string(p.numel()));
    }
    out[p.name] = whole.narrow(0, 0, p.numel()).reshape(p.shape).clone();
  }
  return out;
}

ScalerEntry scaler_of(const PyValue* scaler, const std::string& compute_dtype, const std::string& where) {
  ScalerEntry out;
  out.type = compute_dtype == "fp16" ? "static" : "unit";
  if (!scaler || scaler->is_none()) return out;
  if (scaler->kind != Kind::kObject) throw CheckpointError(where + ": loss_scaler is a " + scaler->kind_name());
  const auto attribute = [&](const char* name) -> const PyValue& {
    const auto* v = scaler->attribute(name);
    if (!v) throw CheckpointError(where + ": loss_scaler has no " + std::string(name));
    return *v;
  };
  out.scale = attribute("cur_scale").as_double(where + " cur_scale");
  if (const auto* dynamic = scaler->attribute("dynamic"); dynamic && dynamic->as_bool(where) && compute_dtype == "fp16") {
    out.type = "dynamic";
    out.iteration = attribute("cur_iter").as_int(where + " cur_iter");
    out.last_overflow_iteration = attribute("last_overflow_iter").as_int(where + " last_overflow_iter");
    out.hysteresis = static_cast<int>(attribute("cur_hysteresis").as_int(where + " cur_hysteresis"));
  }
  return out;
}

}  // namespace

bool is_deepspeed_tag_dir(const std::string& tag_dir) {
  std::error_code ec;
  if (fs::exists(fs::path(tag_dir) / kManifestFile, ec)) return false;
  return fs::exists(fs::path(tag_dir) / "mp_rank_00_model_states.pt", ec) ||
         fs::exists(fs::path(tag_dir) / "zero_pp_rank_0_mp_rank_00_model_states.pt", ec);
}

WholeCheckpoint read_deepspeed_checkpoint(const std::string& dir, const std::string& tag_arg) {
  // ds_to_universal names its tag in `latest_universal`.
  std::string universal_tag;
  if (tag_arg.empty() && !fs::exists(fs::path(dir) / kLatestFile)) {
    std::ifstream in(fs::path(dir) / "latest_universal");
    std::getline(in, universal_tag);
    while (!universal_tag.empty() && std::isspace(static_cast<unsigned char>(universal_tag.back()))) {
      universal_tag.pop_back();
    }
  }
  const auto tag = resolve_tag(dir, universal_tag.empty() ? tag_arg : universal_tag);
  const Tag t = open_tag((fs::path(dir) / tag).string());
  const auto& ms = *t.model_states;
  const std::string where = t.models.empty() ? t.dir + "/mp_rank_00_model_states.pt" : t.models[0];

  WholeCheckpoint out;
  Manifest& m = out.manifest;
  m.tag = tag;
  m.config = to_json(ms.at("ds_config", where), where + " ds_config");
  const auto& config = m.config;
  const auto enabled = [&](const char* section) {
    return config.contains(section) && config[section].is_object() && config[section].value("enabled", false);
  };
  // "bfloat16" is DeepSpeed's older name of the bf16 section, still accepted.
  m.compute_dtype = enabled("bf16") || enabled("bfloat16") ? "bf16" : enabled("fp16") ? "fp16" : "fp32";
  for (const auto& [key, what] : kUnsupportedKeys) {
    if (const auto* v = ms.find(key); v && !v->is_none()) throw CheckpointError(where + ": holds " + key + ": " + what);
  }
  m.zero_stage = config.contains("zero_optimization") ? config["zero_optimization"].value("stage", 0) : 0;
  if (t.universal) {
    const auto& osd = *t.universal_optimizer;
    const auto* stage = osd.find("zero_stage");
    if (stage && stage->kind == Kind::kObject && !stage->items.empty()) {
      m.zero_stage = static_cast<int>(stage->items[0]->as_int(t.dir + "/zero/optimizer_state.pt zero_stage"));
    }
  } else if (t.optim0) {
    const auto* stage = t.optim0->at("optimizer_state_dict", t.optim[0]).find("zero_stage");
    if (stage && stage->kind == Kind::kObject && !stage->items.empty()) {
      m.zero_stage = static_cast<int>(stage->items[0]->as_int(t.optim[0] + " zero_stage"));
    }
  }
  if (!t.universal && t.optim.empty() && m.zero_stage != 0) {
    throw CheckpointError(t.dir + ": ZeRO stage " + std::to_string(m.zero_stage) + " but no zero_pp_rank_*_optim_states.pt");
  }
  if (!t.universal && m.zero_stage == 0 && (!t.optim.empty() || m.compute_dtype != "fp32")) {
    throw CheckpointError(t.dir + ": a " + m.compute_dtype + " run without ZeRO (DeepSpeed's " +
                          (m.compute_dtype == "bf16" ? "BF16_Optimizer" : "FP16_Optimizer") +
                          " layout); converting those is not supported yet");
  }

  // The optimizer: DeepSpeed's Adam or AdamW, whose moments are ours.
  const auto optimizer = config.contains("optimizer") ? config["optimizer"].value("type", "") : std::string();
  std::string lowered = optimizer;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), ::tolower);
  if (lowered != "adam" && lowered != "adamw") {
    throw CheckpointError(where + ": the run's optimizer is " +
                          (optimizer.empty() ? std::string("the script's own (no \"optimizer\" in its config)")
                                             : "\"" + optimizer + "\"") +
                          "; converting the optimizer state of Adam and AdamW (config \"optimizer\") is supported");
  }
  m.optimizer = lowered == "adamw" ? "AdamW" : "Adam";
  m.optimizer_state = kAdamState;

  // The module's entries, in registration order: buffers, frozen parameters and the trainable rest.
  const auto& module = ms.at("module", where);
  std::set<std::string> buffers;
  for (const auto& b : ms.at("buffer_names", where).as_sequence(where + " buffer_names")) {
    buffers.insert(b->as_string(where));
  }
  // A tied parameter is in the module's state under every name; DeepSpeed's shared_params maps the others to the
  // one the optimizer trains (our engine holds it once, under that name).
  std::set<std::string> skip = buffers;
  if (const auto* shared = ms.find("shared_params"); shared && !shared->is_none()) {
    for (const auto& [alias, source] : shared->entries) skip.insert(alias->as_string(where + " shared_params"));
  }
  std::set<std::string> in_groups;
  if (const auto* shapes = ms.find("param_shapes"); shapes && !shapes->is_none()) {
    for (const auto& group : shapes->as_sequence(where + " param_shapes")) {
      for (const auto& p : shapes_of(*group, where + " param_shapes")) in_groups.insert(p.name);
    }
  }
  const auto frozen = read_frozen(t, in_groups, skip);
  std::vector<std::string> trainable;
  for (const auto& [k, v] : module.entries) {
    const auto& name = k->as_string(where);
    if (!skip.count(name) && !frozen.count(name)) trainable.push_back(name);
  }

  const Trained trained = t.universal         ? read_universal(t)
                          : m.zero_stage == 0 ? read_zero0(t, trainable)
                          : m.zero_stage == 3 ? read_zero3(t)
                                              : read_zero12(t);
  m.optimizer_step_count = trained.step;
  std::map<std::string, const ParamEntry*> by_name;
  for (const auto& p : trained.order) by_name.emplace(p.name, &p);
  for (const auto& name : trainable) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      throw CheckpointError(where + ": module parameter '" + name + "' is neither trained by the optimizer nor frozen");
    }
    m.params.push_back(*it->second);
    out.tensors[shard_tensor_name(kMasterKind, name)] = trained.master.at(name);
    for (const auto& kind : kAdamState) out.tensors[shard_tensor_name(kind, name)] = trained.state.at(kind).at(name);
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    throw CheckpointError(where + ": the optimizer trains '" + by_name.begin()->first + "', which the module does not have");
  }
  for (const auto& [k, v] : module.entries) {
    const auto& name = k->as_string(where);
    const bool is_frozen = frozen.count(name) != 0;
    if (!is_frozen && !buffers.count(name)) continue;
    const auto& value = is_frozen ? frozen.at(name) : v->as_tensor(where + " module['" + name + "']");
    ModuleStateEntry e;
    e.name = name;
    e.shape = value.sizes().vec();
    e.dtype = value.scalar_type();
    e.frozen = is_frozen;
    m.module_state.push_back(e);
    out.tensors[shard_tensor_name(kModuleKind, name)] = value.contiguous();
  }

  // Where training stood.
  m.global_steps = ms.at("global_steps", where).as_int(where + " global_steps");
  m.skipped_steps = ms.at("skipped_steps", where).as_int(where + " skipped_steps");
  m.global_samples = ms.at("global_samples", where).as_int(where + " global_samples");
  m.micro_steps = m.global_steps * (config.contains("gradient_accumulation_steps") &&
                                            config["gradient_accumulation_steps"].is_number_integer()
                                        ? config["gradient_accumulation_steps"].get<int64_t>()
                                        : 1);
  m.scheduler = config.contains("scheduler") ? config["scheduler"].value("type", "") : std::string();
  m.scheduler_position = m.global_steps - m.skipped_steps;
  if (const auto* s = ms.find("lr_scheduler"); s && !s->is_none()) {
    // DeepSpeed's schedules count last_batch_iteration from -1: the steps applied are one more.
    if (const auto* last = s->find("last_batch_iteration")) m.scheduler_position = last->as_int(where) + 1;
  }
  m.loss_scaler = t.universal ? scaler_of(t.universal_optimizer->find("loss_scaler"), m.compute_dtype,
                                          t.dir + "/zero/optimizer_state.pt")
                 : t.optim0   ? scaler_of(t.optim0->at("optimizer_state_dict", t.optim[0]).find("loss_scaler"),
                                        m.compute_dtype, t.optim[0])
                           : scaler_of(nullptr, m.compute_dtype, where);

  // Everything else the script saved beside the engine's keys.
  m.client_state = nlohmann::json::object();
  for (const auto& [k, v] : ms.entries) {
    const auto& key = k->as_string(where);
    if (!kEngineKeys.count(key)) m.client_state[key] = to_json(*v, where + " client state '" + key + "'");
  }
  if (m.client_state.empty()) m.client_state = nullptr;
  return out;
}

}  // namespace dscpp
