// Checkpointer: the engine's state to and from the checkpoint format (see checkpointer.h). A save holds nothing
// beyond one fragment in flight; a load reads into a second copy of the partition (master and optimizer state) and
// only then replaces the engine's, so a failed load leaves the engine as it was.
#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "dscpp/activation/rng_state.h"
#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/checkpoint/checkpoint_reader.h"
#include "dscpp/checkpoint/safetensors.h"
#include "dscpp/engine/checkpointer.h"
#include "dscpp/fault/kill_point.h"

namespace fs = std::filesystem;

namespace dscpp {
namespace {

// Runs `fn` on this rank and makes every rank agree on the outcome: if any rank failed, every rank throws (the
// failed one with its own message), so no rank goes on into a collective the others will never join.
void all_or_none(Comm& comm, const std::string& what, const std::function<void()>& fn) {
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto failed = comm.side_all_gather({error.empty() ? 0 : 1});
  for (int r = 0; r < static_cast<int>(failed.size()); ++r) {
    if (failed[r] == 0) continue;
    throw CheckpointError(error.empty() ? what + ": failed on rank " + std::to_string(r) + " (its error is in its log)"
                                        : error);
  }
}

std::string shape_text(const std::vector<int64_t>& shape) { return c10::str(c10::IntArrayRef(shape)); }

// Throws unless the checkpoint holds exactly this model's trainable parameters, with the same shapes.
// `strict` false: only the parameters both have must agree (in shape), as torch's load_state_dict(strict=False).
// `whole_model` false (a model-parallel rank holds part of the model): the checkpoint's parameters this rank does not
// hold are another rank's to check (Checkpointer::check_all_held).
void check_same_model(const Manifest& m, const std::vector<ParamEntry>& params, const std::string& source,
                      bool strict, bool whole_model) {
  std::map<std::string, const ParamEntry*> ours;
  for (const auto& p : params) ours.emplace(p.name, &p);
  if (params.empty() && !m.params.empty()) {
    throw CheckpointError(source + ": it holds " + std::to_string(m.params.size()) + " trained parameters ('" +
                          m.params.front().name + "', ...), and this engine trains none (every parameter of the "
                          "model has requires_grad false); load it into an engine that trains them, or one built "
                          "without an optimizer (forward only)");
  }
  for (const auto& p : m.params) {
    auto it = ours.find(p.name);
    if (it == ours.end()) {
      if (!strict || !whole_model) continue;
      throw CheckpointError(source + ": written for a different model: it has parameter '" + p.name +
                            "', this model does not");
    }
    if (it->second->shape != p.shape) {
      throw CheckpointError(source + ": written for a different model: parameter '" + p.name + "' is " +
                            shape_text(p.shape) + " there, " + shape_text(it->second->shape) + " here");
    }
    ours.erase(it);
  }
  if (strict && !ours.empty()) {
    throw CheckpointError(source + ": written for a different model: this model has parameter '" +
                          ours.begin()->first + "', the checkpoint does not (load_module_strict = false keeps its "
                          "value)");
  }
}

}  // namespace

void Checkpointer::check_at_boundary(const char* what) const {
  if (s_.progress.micro_steps % s_.config.batch.grad_accum != 0) {
    throw std::logic_error(std::string(what) + ": called after micro-step " + std::to_string(s_.progress.micro_steps) +
                           ", inside an accumulation of " + std::to_string(s_.config.batch.grad_accum) +
                           "; call it after the step() that ends one");
  }
}

int64_t Checkpointer::master_offset(const ShardFragment& f) const { return s_.stage.master_offset(f, rank()); }

// DeepSpeed's checkpoint.tag_validation: every rank must save under the same tag, or their shards would land in
// different directories. "Warn" logs, "Fail" throws on every rank, "Ignore" skips the exchange.
void Checkpointer::validate_tag_across_ranks(const std::string& tag) const {
  const auto& mode = s_.config.checkpoint.tag_validation;
  if (mode == "Ignore" || world_size() == 1) return;
  const auto hashes = world().side_all_gather({static_cast<int64_t>(std::hash<std::string>{}(tag))});
  for (int r = 0; r < static_cast<int>(hashes.size()); ++r) {
    if (hashes[r] == hashes[0]) continue;
    const std::string what = "save_checkpoint: rank " + std::to_string(r) + " saves under another tag than rank 0 "
                              "(this rank: '" + tag + "'); every rank must pass the same tag "
                              "(checkpoint.tag_validation is " + mode + ")";
    if (mode == "Fail") throw CheckpointError(what);
    s_.log("[deepspeed.cpp] warning: " + what);
    return;
  }
}

std::vector<ShardFragment> Checkpointer::master_fragments() const { return s_.stage.master_fragments(rank()); }

std::vector<Checkpointer::ShardTensor> Checkpointer::shard_contents(const std::vector<int>& modules) const {
  const auto& layout = s_.stage.layout();
  const auto kinds = s_.optimizer.state_kinds();
  std::vector<ShardTensor> out;
  for (const auto& f : layout.shard_fragments(rank())) {
    const auto& name = layout.slots()[f.slot].name;
    if (s_.written_elsewhere.count(name)) continue;
    out.push_back({shard_tensor_name(kMasterKind, name), kMasterKind, f});
    for (const auto& kind : kinds) out.push_back({shard_tensor_name(kind, name), kind, f});
    if (s_.dtype != torch::kFloat32) out.push_back({shard_tensor_name(kParam16Kind, name), kParam16Kind, f});
  }
  const auto rank_state = s_.optimizer.rank_state();
  for (size_t i = 0; i < rank_state.size(); ++i) {
    out.push_back({shard_tensor_name(kOptimizerRankKind, rank_state[i].first), kOptimizerRankKind, {},
                   static_cast<int>(i)});
  }
  const auto replicated = s_.optimizer.replicated_state();
  for (size_t i = 0; i < replicated.size(); ++i) {
    out.push_back({shard_tensor_name(kOptimizerReplicatedKind, replicated[i].first), kOptimizerReplicatedKind, {},
                   static_cast<int>(i)});
  }
  out.push_back({kRngTensor, kRngTensor, {}});
  // Dropout on a GPU draws from the GPU's generator: without its state a resumed run would not be exact.
  if (s_.device.is_cuda()) out.push_back({kRngCudaTensor, kRngCudaTensor, {}});
  if (writes_module_state()) {
    for (int i : modules) {
      out.push_back({shard_tensor_name(kModuleKind, s_.module_state[i].name), kModuleKind, {}, i});
    }
  }
  return out;
}

std::vector<int> Checkpointer::saved_module_state(const CheckpointSaveOptions& options) const {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(s_.module_state.size()); ++i) {
    if (!(options.exclude_frozen_parameters && s_.module_state[i].frozen)) out.push_back(i);
  }
  return out;
}

std::string Checkpointer::save(const std::string& save_dir, const std::string& tag_arg,
                               const nlohmann::json& client_state, const CheckpointSaveOptions& options) {
  check_at_boundary("save_checkpoint");
  const auto modules = saved_module_state(options);
  const std::string tag = tag_arg.empty() ? "global_step" + std::to_string(s_.progress.global_steps) : tag_arg;
  validate_tag_across_ranks(tag);
  const std::string staging = staging_dir(save_dir, tag);
  all_or_none(world(), "save_checkpoint", [&] {
    check_tag(tag);
    if (world_rank() != 0) return;
    prepare_staging(save_dir, tag);
    if (options.save_latest) mark_first_save(save_dir);
  });

  // 1. Every rank writes its shard file and its description into the staging directory.
  all_or_none(world(), "save_checkpoint", [&] { write_shard(staging, tag, modules, assemble_frozen(modules)); });
  fault::kill_point("checkpoint.shard_written");

  // 2. Rank 0 of the run merges the descriptions into the manifest, writes it and publishes the tag.
  all_or_none(world(), "save_checkpoint", [&] {
    if (world_rank() != 0) return;
    auto manifest = describe_checkpoint(tag, client_state);
    merge_descriptions(staging, manifest);
    write_file_durably((fs::path(staging) / kManifestFile).string(), manifest.to_json().dump(1));
    fault::kill_point("checkpoint.manifest_written");
    publish_staging(save_dir, tag);
    fault::kill_point("checkpoint.published");
    if (options.save_latest) write_latest(save_dir, tag);
  });
  s_.log("[deepspeed.cpp] saved checkpoint " + (fs::path(save_dir) / tag).string() + " (step " +
       std::to_string(s_.progress.global_steps) + ", " + std::to_string(world_size()) + " shard files)");
  return (fs::path(save_dir) / tag).string();
}

namespace {

// A rank's description beside its shard file: "rank_00003.safetensors" → "rank_00003.json".
std::string description_file(const std::string& staging, int rank) {
  return (fs::path(staging) / fs::path(shard_file_name(rank)).replace_extension(".json")).string();
}

}  // namespace

// The frozen parameters among `modules` that the stage partitions, whole, on the rank that writes them (ZeRO-3
// keeps only shards: assembling each is collective, so every rank of the group takes part, one at a time). The
// checkpoint holds them whole in that rank's file, as it holds every module tensor.
// An error on one rank (host memory running out on the writer) is held until every rank has taken part in every
// collective, then thrown, so the others are not left waiting in the next one.
std::map<int, torch::Tensor> Checkpointer::assemble_frozen(const std::vector<int>& modules) {
  std::map<int, torch::Tensor> out;
  std::exception_ptr failed;
  for (int i : modules) {
    const auto& t = s_.module_state[i];
    if (!s_.stage.partitions_frozen(t.tensor)) continue;
    auto whole = s_.stage.whole_param(t.tensor);
    try {
      if (writes_module_state() && !failed) out.emplace(i, whole.detach().cpu());
    } catch (...) {
      failed = std::current_exception();
      out.clear();
    }
  }
  if (failed) std::rethrow_exception(failed);
  return out;
}

// A module tensor's whole shape: its own, or (partitioned, so empty between uses) the one recorded at initialize.
std::vector<int64_t> Checkpointer::module_shape(const CheckpointedState::ModuleTensor& t) const {
  return s_.stage.partitions_frozen(t.tensor) ? t.shape : t.tensor.sizes().vec();
}

void Checkpointer::write_shard(const std::string& staging, const std::string& tag, const std::vector<int>& modules,
                               const std::map<int, torch::Tensor>& assembled) {
  const RngState rng = RngState::capture(s_.device);
  // The compute-dtype weights are the master rounded (what publishing makes them); the writer rounds each fragment
  // as it writes it, so no second copy of the partition exists.
  const auto kinds = s_.optimizer.state_kinds();
  const auto rank_state = s_.optimizer.rank_state();
  const auto replicated = s_.optimizer.replicated_state();
  auto value_of = [&](const ShardTensor& t) -> torch::Tensor {
    if (t.kind == kRngTensor) return rng.cpu();
    if (t.kind == kRngCudaTensor) return rng.cuda();
    if (t.kind == kModuleKind) {
      const auto it = assembled.find(t.index);
      return it != assembled.end() ? it->second : s_.module_state[t.index].tensor.detach().cpu();
    }
    if (t.kind == kOptimizerRankKind) return rank_state.at(t.index).second.cpu();
    if (t.kind == kOptimizerReplicatedKind) return replicated.at(t.index).second.cpu();
    const bool master = t.kind == kMasterKind || t.kind == kParam16Kind;
    const int kind = master ? 0 : 1 + static_cast<int>(std::find(kinds.begin(), kinds.end(), t.kind) - kinds.begin());
    return master_state(kind, master_offset(t.fragment), t.fragment.numel);
  };
  const auto contents = shard_contents(modules);
  std::vector<TensorInfo> infos;
  for (const auto& t : contents) {
    const auto value = value_of(t);
    infos.push_back({t.name, t.kind == kParam16Kind ? s_.dtype : value.scalar_type(), value.sizes().vec()});
  }
  SafetensorsWriter writer((fs::path(staging) / shard_file_name(world_rank())).string(), infos,
                           {{"format", "deepspeed.cpp shard"}, {"tag", tag}, {"rank", std::to_string(world_rank())}});
  for (size_t i = 0; i < contents.size(); ++i) {
    writer.write(contents[i].name, value_of(contents[i]));
    if (i == contents.size() / 2) fault::kill_point("checkpoint.shard_half_written");
  }
  writer.close();
  std::vector<uint32_t> sums;
  for (const auto& t : contents) sums.push_back(writer.tensor_crc32(t.name));

  nlohmann::json params = nlohmann::json::array(), module_state = nlohmann::json::array();
  for (const auto& p : s_.params) params.push_back(to_json(p));
  if (writes_module_state()) {
    for (int i : modules) {
      const auto& t = s_.module_state[i];
      module_state.push_back(
          to_json(ModuleStateEntry{t.name, module_shape(t), t.tensor.scalar_type(), t.frozen, world_rank()}));
    }
  }
  const nlohmann::json description = {
      {"file", describe_shard(contents, writer.file_bytes(), writer.file_crc32(), sums).to_json()},
      {"params", params},
      {"module_state", module_state}};
  write_file_durably(description_file(staging, world_rank()), description.dump());
}

ShardFile Checkpointer::describe_shard(const std::vector<ShardTensor>& contents, int64_t bytes, uint32_t crc32,
                                       const std::vector<uint32_t>& tensor_crc32) const {
  ShardFile file{world_rank(), shard_file_name(world_rank()), bytes, crc32, {}, {}};
  for (size_t i = 0; i < contents.size(); ++i) {
    const auto& t = contents[i];
    if (t.kind == kMasterKind) {
      const auto& name = s_.stage.layout().slots()[t.fragment.slot].name;
      const auto* slice = slice_of(name);
      file.fragments.push_back({name, t.fragment.param_begin, t.fragment.numel,
                                slice ? std::optional<TensorSlice>(*slice) : std::nullopt});
    }
    file.tensor_crc32[t.name] = tensor_crc32[i];
  }
  return file;
}

void Checkpointer::merge_descriptions(const std::string& staging, Manifest& m) const {
  std::set<std::string> params, modules;
  for (int r = 0; r < world_size(); ++r) {
    const auto path = description_file(staging, r);
    std::ifstream in(path);
    nlohmann::json d;
    try {
      d = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw CheckpointError(path + ": rank " + std::to_string(r) + "'s description of its shard is unreadable (" +
                            e.what() + ")");
    }
    m.files.push_back(ShardFile::from_json(d.at("file"), path));
    for (const auto& p : d.at("params")) {
      auto entry = param_entry_from_json(p, path);
      if (params.insert(entry.name).second) m.params.push_back(std::move(entry));
    }
    for (const auto& e : d.at("module_state")) {
      auto entry = module_state_entry_from_json(e, path);
      if (modules.insert(entry.name).second) m.module_state.push_back(std::move(entry));
    }
    in.close();
    fs::remove(path);
  }
}

const TensorSlice* Checkpointer::slice_of(const std::string& param) const {
  const auto it = s_.slices.find(param);
  return it == s_.slices.end() ? nullptr : &it->second;
}

Manifest Checkpointer::describe_checkpoint(const std::string& tag, const nlohmann::json& client_state) const {
  Manifest m;
  m.tag = tag;
  m.world_size = world_size();
  m.pipeline_parallel = s_.pipeline_parallel;
  m.tensor_parallel = s_.tensor_parallel;
  m.zero_stage = s_.stage.stage();
  m.compute_dtype = to_string(s_.config.compute_dtype());
  m.global_steps = s_.progress.global_steps;
  m.micro_steps = s_.progress.micro_steps;
  m.skipped_steps = s_.progress.skipped_steps;
  m.global_samples = s_.progress.global_samples;
  m.optimizer = s_.optimizer.name();
  m.optimizer_step_count = s_.optimizer.step_count();
  m.optimizer_state = s_.optimizer.state_kinds();
  m.scheduler = s_.config.scheduler ? s_.config.scheduler->type : "";
  m.scheduler_position = s_.progress.schedule_steps;
  const auto scaler = s_.scaler.state();
  m.loss_scaler = {s_.scaler.name(), scaler.scale, scaler.iteration, scaler.last_overflow_iteration, scaler.hysteresis};
  m.config = s_.config.resolved;
  m.client_state = client_state;
  return m;
}

LoadedCheckpoint Checkpointer::load(const std::string& load_dir, const std::string& tag_arg,
                                    const CheckpointLoadOptions& options) {
  check_at_boundary("load_checkpoint");
  LoadedCheckpoint loaded;
  std::unique_ptr<CheckpointReader> checkpoint;
  all_or_none(world(), "load_checkpoint", [&] {
    loaded.tag = resolve_tag(load_dir, tag_arg);
    loaded.path = (fs::path(load_dir) / loaded.tag).string();
    checkpoint = std::make_unique<CheckpointReader>(loaded.path);
    check_compatible(checkpoint->manifest(), options, (fs::path(loaded.path) / kManifestFile).string());
  });
  // Each rank read `latest` for itself: a save finishing in between could have given them different tags.
  const auto tags = world().side_all_gather({static_cast<int64_t>(std::hash<std::string>{}(loaded.tag))});
  if (std::any_of(tags.begin(), tags.end(), [&](int64_t t) { return t != tags[0]; })) {
    throw CheckpointError("load_checkpoint: the ranks resolved different tags in " + load_dir + " (this rank: '" +
                          loaded.tag + "'; was `latest` replaced during the load?); pass the tag explicitly");
  }
  const Manifest& m = checkpoint->manifest();
  if (options.load_module_strict && !holds_whole_model()) {
    check_all_held(m, (fs::path(loaded.path) / kManifestFile).string());
  }

  // Read everything this rank's partition needs into copies, so a failure leaves the engine as it was. Elements no
  // parameter covers (group padding) keep this engine's values.
  const auto kinds = s_.optimizer.state_kinds();
  // Forward only, there is no optimizer state to load into, whatever the options ask (DeepSpeed's engine without an
  // optimizer has none either).
  const bool optimizer_states = options.load_optimizer_states && !options.load_module_only && !s_.forward_only;
  std::vector<StateStore::Update> writes;
  torch::Tensor rng_state, cuda_rng_state;
  std::vector<torch::Tensor> module_values;  // per module_state entry: its saved value, or undefined (kept)
  std::vector<torch::Tensor> shard_pieces;   // forward only: per entry, this rank's shard of a trained value
  std::vector<torch::Tensor> rank_state;     // per optimizer rank_state() entry: its saved value, or undefined (zeros)
  std::vector<torch::Tensor> replicated;     // per replicated_state() entry: its saved value, or undefined (kept)
  std::set<std::string> saved;  // the parameters the checkpoint has (all of this model's, when strict)
  for (const auto& p : m.params) saved.insert(p.name);
  int64_t kept_params = 0;
  for (const auto& p : s_.params) kept_params += saved.count(p.name) ? 0 : 1;
  all_or_none(world(), "load_checkpoint", [&] {
    const auto& layout = s_.stage.layout();
    for (const auto& want : master_fragments()) {
      const auto& name = layout.slots()[want.slot].name;
      if (!saved.count(name)) continue;  // load_module_strict = false: it keeps this engine's value and state
      for (size_t k = 0; k <= (optimizer_states ? kinds.size() : 0); ++k) {
        // Files are read on the host; the engine copies into device partitions at the commit.
        auto values = torch::empty({want.numel}, torch::kFloat32);
        checkpoint->read_range(k == 0 ? kMasterKind : kinds[k - 1], name, want.param_begin, values, slice_of(name));
        writes.push_back({static_cast<int>(k), master_offset(want), values});
      }
    }
    if (optimizer_states) rank_state = read_rank_state(*checkpoint);
    if (optimizer_states) replicated = read_replicated_state(*checkpoint);
    // A checkpoint converted from DeepSpeed's has no generator states (DeepSpeed saves none): they keep their own.
    if (world_rank() < m.world_size && !options.load_module_only &&
        m.files[world_rank()].tensor_crc32.count(kRngTensor)) {
      rng_state = checkpoint->read(world_rank(), kRngTensor);
      if (s_.device.is_cuda() && m.files[world_rank()].tensor_crc32.count(kRngCudaTensor)) {
        cuda_rng_state = checkpoint->read(world_rank(), kRngCudaTensor);
      }
    }
    module_values = read_module_state(*checkpoint, (fs::path(loaded.path) / kManifestFile).string());
    if (s_.forward_only) read_trained_into_frozen(*checkpoint, module_values, shard_pieces);
  });

  // Commit: the master and optimizer state, then the compute-dtype weights from them, then what the manifest carries.
  commit_master_writes(writes);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < shard_pieces.size(); ++i) {
      if (shard_pieces[i].defined()) s_.stage.write_frozen_shard(s_.module_state[i].tensor, shard_pieces[i]);
    }
    for (size_t i = 0; i < module_values.size(); ++i) {
      if (!module_values[i].defined()) continue;
      const auto& tensor = s_.module_state[i].tensor;
      if (s_.stage.partitions_frozen(tensor)) {
        s_.stage.write_frozen(tensor, module_values[i]);  // this rank's shard of it
      } else {
        tensor.copy_(module_values[i]);
      }
    }
    if (optimizer_states) {
      auto ours = s_.optimizer.rank_state();
      for (size_t i = 0; i < ours.size(); ++i) {
        if (rank_state[i].defined()) {
          ours[i].second.copy_(rank_state[i]);
        } else {
          ours[i].second.zero_();
        }
      }
      auto replicated_ours = s_.optimizer.replicated_state();
      for (size_t i = 0; i < replicated_ours.size(); ++i) {
        if (replicated[i].defined()) replicated_ours[i].second.copy_(replicated[i]);
      }
    }
  }
  if (optimizer_states) s_.optimizer.set_step_count(m.optimizer_step_count);
  if (!options.load_module_only) restore_progress(m, rng_state, cuda_rng_state, options.load_lr_scheduler_states);
  loaded.client_state = m.client_state;
  s_.log("[deepspeed.cpp] loaded " + std::string(options.load_module_only ? "the weights of " : "") + "checkpoint " +
         loaded.path + " (step " + std::to_string(m.global_steps) + ", written by " + std::to_string(m.world_size) +
         " ranks at ZeRO stage " + std::to_string(m.zero_stage) +
         (m.pipeline_parallel * m.tensor_parallel > 1
              ? ", " + std::to_string(m.pipeline_parallel) + " pipeline stages x " +
                    std::to_string(m.tensor_parallel) + " tensor-parallel slices"
              : std::string()) +
         ")" +
         (kept_params ? "; " + std::to_string(kept_params) + " parameters it does not have keep their values" : ""));
  return loaded;
}

// Rank 0's saved value of each of the optimizer's replicated_state() entries, whatever the world size that wrote
// it; undefined where the checkpoint has none (written by another optimizer: the state keeps its start).
std::vector<torch::Tensor> Checkpointer::read_replicated_state(CheckpointReader& checkpoint) const {
  const auto ours = s_.optimizer.replicated_state();
  std::vector<torch::Tensor> out(ours.size());
  const Manifest& m = checkpoint.manifest();
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto name = shard_tensor_name(kOptimizerReplicatedKind, ours[i].first);
    if (m.files.empty() || !m.files[0].tensor_crc32.count(name)) continue;
    auto value = checkpoint.read(0, name);
    if (value.sizes() != ours[i].second.sizes()) {
      throw CheckpointError(checkpoint.tag_dir() + ": " + name + " is " + c10::str(value.sizes()) + ", this run's " +
                            c10::str(ours[i].second.sizes()) + " (a checkpoint of another model)");
    }
    out[i] = std::move(value);
  }
  return out;
}

// This rank's saved value of each of the optimizer's rank_state() entries, or undefined ones (the state starts at
// zero) when the checkpoint was written at another world size or lacks them; logged, as the run is then not exact.
std::vector<torch::Tensor> Checkpointer::read_rank_state(CheckpointReader& checkpoint) const {
  const auto ours = s_.optimizer.rank_state();
  std::vector<torch::Tensor> out(ours.size());
  if (ours.empty()) return out;
  const Manifest& m = checkpoint.manifest();
  const bool same_world = m.world_size == world_size();
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto name = shard_tensor_name(kOptimizerRankKind, ours[i].first);
    if (!same_world || !m.files[world_rank()].tensor_crc32.count(name)) continue;
    auto value = checkpoint.read(world_rank(), name);
    if (value.sizes() != ours[i].second.sizes()) {
      throw CheckpointError(checkpoint.tag_dir() + ": rank " + std::to_string(world_rank()) + "'s " + name +
                            " is " + c10::str(value.sizes()) + ", this run's " + c10::str(ours[i].second.sizes()));
    }
    out[i] = std::move(value);
  }
  if (world_rank() == 0 && std::any_of(out.begin(), out.end(), [](const torch::Tensor& t) { return !t.defined(); })) {
    s_.log("[deepspeed.cpp] the checkpoint has no " + s_.optimizer.name() + " " + ours[0].first + " for this run (" +
           (same_world ? std::string("not saved") : "written by " + std::to_string(m.world_size) + " ranks, read by " +
                                                        std::to_string(world_size())) +
           "): it starts at zero, as every DeepSpeed resume starts it");
  }
  return out;
}

// Counters (and the schedule's position, unless it stays), the loss scaler and this rank's generators.
void Checkpointer::restore_progress(const Manifest& m, const torch::Tensor& rng_state,
                                    const torch::Tensor& cuda_rng_state, bool schedule_position) {
  s_.progress.global_steps = m.global_steps;
  // Saved on a boundary, so in this run's micro-steps: a run resumed at another world size keeps the global batch by
  // another accumulation, and the saved count (3 micro-steps of 1) would put its next boundary mid-batch (at 1 of 2).
  s_.progress.micro_steps = m.global_steps * s_.config.batch.grad_accum;
  s_.progress.skipped_steps = m.skipped_steps;
  s_.progress.global_samples = m.global_samples;
  if (schedule_position) s_.progress.schedule_steps = m.scheduler_position;
  if (m.loss_scaler.type == s_.scaler.name()) {
    s_.scaler.load_state({m.loss_scaler.scale, m.loss_scaler.iteration, m.loss_scaler.last_overflow_iteration,
                         m.loss_scaler.hysteresis});
  } else {
    s_.log("[deepspeed.cpp] the checkpoint's loss scaler is " + m.loss_scaler.type + ", this run's " +
           s_.scaler.name() + ": the scaler starts fresh");
  }
  if (rng_state.defined()) {
    RngState(rng_state, cuda_rng_state.defined() ? std::optional<torch::Device>(s_.device) : std::nullopt,
             cuda_rng_state)
        .restore();
  }
  if (s_.device.is_cuda() && rng_state.defined() && !cuda_rng_state.defined()) {
    s_.log("[deepspeed.cpp] the checkpoint has no CUDA generator state (it was written by a CPU run): this rank's "
         "GPU generator keeps its own");
  }
  if (m.world_size < world_size()) {
    s_.log("[deepspeed.cpp] the checkpoint has " + std::to_string(m.world_size) + " ranks' generator states: ranks " +
         std::to_string(m.world_size) + ".." + std::to_string(world_size() - 1) + " keep their own");
  }
}

// The saved value of each module_state entry the checkpoint has (rank 0's file, by name), or an undefined tensor
// where it has none (an older checkpoint, a save that excluded frozen parameters, another model's buffers): that
// tensor keeps its value. A floating tensor may come from a run of another compute dtype (bf16 buffers into an fp32
// run: the copy converts them); another shape, or a floating one saved for an integer one, is an error.
std::vector<torch::Tensor> Checkpointer::read_module_state(CheckpointReader& checkpoint,
                                                           const std::string& source) const {
  std::map<std::string, const ModuleStateEntry*> saved;
  for (const auto& e : checkpoint.manifest().module_state) saved.emplace(e.name, &e);
  std::vector<torch::Tensor> out(s_.module_state.size());
  for (size_t i = 0; i < s_.module_state.size(); ++i) {
    const auto& ours = s_.module_state[i];
    const auto it = saved.find(ours.name);
    if (it == saved.end()) continue;
    const auto saved_dtype = it->second->dtype, dtype = ours.tensor.scalar_type();
    const bool both_floating = c10::isFloatingType(saved_dtype) && c10::isFloatingType(dtype);
    const auto shape = module_shape(ours);
    if (it->second->shape != shape || (saved_dtype != dtype && !both_floating)) {
      throw CheckpointError(source + ": module tensor '" + ours.name + "' is " + shape_text(it->second->shape) + " " +
                            c10::toString(saved_dtype) + " there, " + shape_text(shape) + " " +
                            c10::toString(dtype) + " here");
    }
    out[i] = checkpoint.read(it->second->rank, shard_tensor_name(kModuleKind, ours.name));
  }
  return out;
}

void Checkpointer::read_trained_into_frozen(CheckpointReader& checkpoint, std::vector<torch::Tensor>& module_values,
                                            std::vector<torch::Tensor>& shard_pieces) const {
  std::set<std::string> trained;
  for (const auto& p : checkpoint.manifest().params) trained.insert(p.name);
  shard_pieces.assign(s_.module_state.size(), torch::Tensor());
  for (size_t i = 0; i < s_.module_state.size(); ++i) {
    const auto& ours = s_.module_state[i];
    if (!ours.frozen || !trained.count(ours.name)) continue;
    const auto shape = module_shape(ours);
    int64_t begin = 0, numel = 1;
    for (const int64_t d : shape) numel *= d;
    const auto range = s_.stage.frozen_shard_range(ours.tensor);
    if (range) std::tie(begin, numel) = *range;
    auto master = torch::empty({numel}, torch::kFloat32);
    if (numel > 0) checkpoint.read_range(kMasterKind, ours.name, begin, master, slice_of(ours.name));
    // In the compute dtype at once: a rank holds its weights once more, not twice as many fp32 bytes.
    auto values = master.to(ours.tensor.scalar_type());
    if (range) {
      shard_pieces[i] = std::move(values);
    } else {
      module_values[i] = values.view(shape);
    }
  }
}

void Checkpointer::check_forward_only_model(const Manifest& m, const std::string& source, bool strict) const {
  std::map<std::string, const CheckpointedState::ModuleTensor*> ours;
  for (const auto& t : s_.module_state) {
    if (t.frozen) ours.emplace(t.name, &t);
  }
  for (const auto& p : m.params) {
    const auto it = ours.find(p.name);
    if (it == ours.end()) {
      if (!strict) continue;
      throw CheckpointError(source + ": written for a different model: it has parameter '" + p.name +
                            "', this model does not");
    }
    if (module_shape(*it->second) != p.shape) {
      throw CheckpointError(source + ": written for a different model: parameter '" + p.name + "' is " +
                            shape_text(p.shape) + " there, " + shape_text(module_shape(*it->second)) + " here");
    }
    ours.erase(it);
  }
  if (!strict) return;
  for (const auto& e : m.module_state) ours.erase(e.name);
  if (!ours.empty()) {
    throw CheckpointError(source + ": written for a different model: this model has parameter '" +
                          ours.begin()->first + "', the checkpoint does not (load_module_strict = false keeps its "
                          "value)");
  }
}

void Checkpointer::check_compatible(const Manifest& m, const CheckpointLoadOptions& options,
                                    const std::string& source) const {
  if (s_.forward_only) return check_forward_only_model(m, source, options.load_module_strict);
  check_same_model(m, s_.params, source, options.load_module_strict, holds_whole_model());
  if (options.load_optimizer_states && !options.load_module_only &&
      (m.optimizer != s_.optimizer.name() || m.optimizer_state != s_.optimizer.state_kinds())) {
    std::string kinds;
    for (const auto& k : m.optimizer_state) kinds += (kinds.empty() ? "" : ", ") + k;
    throw CheckpointError(source + ": optimizer " + m.optimizer + " (state: " + kinds + ") cannot be loaded into " +
                          s_.optimizer.name() + "; load with load_optimizer_states = false to keep only the weights "
                          "and counters");
  }
}

// Every parameter of the checkpoint must be some rank's: each rank flags the ones it holds, and the flags of all
// ranks (the same on every rank) name the first one none holds.
void Checkpointer::check_all_held(const Manifest& m, const std::string& source) const {
  std::set<std::string> ours;
  for (const auto& p : s_.params) ours.insert(p.name);
  std::vector<int64_t> held;
  for (const auto& p : m.params) held.push_back(ours.count(p.name) ? 1 : 0);
  const auto all = world().side_all_gather(held);
  for (size_t i = 0; i < m.params.size(); ++i) {
    bool any = false;
    for (int r = 0; r < world_size(); ++r) any = any || all[r * m.params.size() + i] != 0;
    if (!any) {
      throw CheckpointError(source + ": written for a different model: it has parameter '" + m.params[i].name +
                            "', no rank of this model holds it (load_module_strict = false ignores it)");
    }
  }
}

void Checkpointer::load_weights(const WeightSource& source, const std::function<bool(const std::string&)>& wanted) {
  check_at_boundary("load_weights");
  std::vector<StateStore::Update> writes;
  all_or_none(s_.comm, "load_weights", [&] {
    const auto& layout = s_.stage.layout();
    for (const auto& want : master_fragments()) {
      const auto& slot = layout.slots()[want.slot];
      if (wanted && !wanted(slot.name)) continue;
      const auto value = source(slot.name, slot.shape);
      if (!value.defined() || value.sizes().vec() != slot.shape) {
        throw std::invalid_argument("load_weights: the value given for '" + slot.name + "' is " +
                                    (value.defined() ? c10::str(value.sizes()) : std::string("undefined")) +
                                    ", the parameter is " + shape_text(slot.shape));
      }
      writes.push_back({0, master_offset(want),
                        value.reshape({-1}).narrow(0, want.param_begin, want.numel).to(torch::kFloat32).clone()});
    }
  });
  commit_master_writes(writes);
}

torch::Tensor Checkpointer::master_state(int kind, int64_t offset, int64_t numel) {
  if (s_.offload) {
    auto out = torch::empty({numel}, torch::kFloat32);
    s_.offload->store().read(kind, offset, out);
    return out;
  }
  auto& whole = kind == 0 ? s_.stage.master_params() : s_.optimizer.state_tensors().at(kind - 1).second;
  return whole.narrow(0, offset, numel);
}

void Checkpointer::commit_master_writes(const std::vector<StateStore::Update>& writes) {
  {
    torch::NoGradGuard no_grad;
    if (s_.offload) {
      s_.offload->store().write(writes);
    } else {
      auto states = s_.optimizer.state_tensors();
      for (const auto& w : writes) {
        auto& whole = w.kind == 0 ? s_.stage.master_params() : states.at(w.kind - 1).second;
        whole.narrow(0, w.offset, w.values.numel()).copy_(w.values);
      }
    }
  }
  if (s_.offload) {
    s_.offload->publish();
  } else {
    s_.stage.publish_params();
  }
}

}  // namespace dscpp
