// consolidate: assemble each parameter from the shard files' fragments and stream it into the output shards.
#include "dscpp/checkpoint/consolidate.h"

#include <cctype>
#include <filesystem>
#include <map>
#include <optional>

#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/checkpoint/checkpoint_reader.h"
#include "dscpp/checkpoint/hf_gpt2.h"
#include "dscpp/checkpoint/manifest.h"
#include "dscpp/checkpoint/safetensors.h"

namespace fs = std::filesystem;

namespace dscpp {
namespace {

std::optional<torch::ScalarType> dtype_named(const std::string& name) {
  if (name == "fp32") return torch::kFloat32;
  if (name == "bf16") return torch::kBFloat16;
  if (name == "fp16") return torch::kFloat16;
  return std::nullopt;
}

// One tensor of the output: a trained parameter (assembled from its fragments and slices) or a module tensor (a
// buffer or frozen parameter, whole in one rank's file).
struct OutputTensor {
  std::string name;
  std::vector<int64_t> shape;
  torch::ScalarType dtype;  // as written
  bool module = false;
  int file = 0;  // a module tensor's: the rank whose file holds it
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

}  // namespace

int64_t parse_byte_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) {
    ++digits;
  }
  std::string unit = text.substr(digits);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::map<std::string, double> units = {{"", 1},      {"B", 1},       {"KB", 1e3},           {"MB", 1e6},
                                               {"GB", 1e9},  {"TB", 1e12},   {"KIB", 1024.0},       {"MIB", 1048576.0},
                                               {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  auto it = units.find(unit);
  double value = -1;
  try {
    size_t used = 0;
    if (digits) value = std::stod(text.substr(0, digits), &used);
    if (used != digits) value = -1;  // "1.2.3"
  } catch (const std::exception&) {
    value = -1;
  }
  if (it == units.end() || value <= 0 || (it != units.end() && value * it->second > 9e18)) {
    throw std::invalid_argument("size '" + text + "': expected a positive number with an optional unit (B, KB, MB, "
                                "GB, TB, KiB, MiB, GiB, TiB), e.g. 5GB");
  }
  return static_cast<int64_t>(value * it->second);
}

ConsolidateResult consolidate(const std::string& checkpoint_dir, const std::string& out_dir,
                              const ConsolidateOptions& options) {
  ConsolidateResult result;
  result.tag = resolve_tag(checkpoint_dir, options.tag);
  CheckpointReader checkpoint((fs::path(checkpoint_dir) / result.tag).string());
  const Manifest& m = checkpoint.manifest();
  if (options.max_shard_bytes <= 0) throw std::invalid_argument("consolidate: max_shard_bytes must be > 0");

  // The 16-bit weights as trained, when asked for that dtype; otherwise the fp32 master (rounded if asked).
  const bool from_param16 = options.dtype != torch::kFloat32 && dtype_named(m.compute_dtype) == options.dtype;
  const std::string kind = from_param16 ? kParam16Kind : kMasterKind;

  // What the model's state_dict holds: the trained parameters, then (native format) the buffers and frozen
  // parameters, floating ones in the asked dtype and the others (BatchNorm's num_batches_tracked) as saved.
  const bool hf = options.format == WeightsFormat::kHfGpt2;
  std::vector<OutputTensor> tensors;
  for (const auto& p : m.params) tensors.push_back({p.name, p.shape, options.dtype, false});
  if (!hf) {
    for (const auto& e : m.module_state) {
      tensors.push_back({e.name, e.shape, c10::isFloatingType(e.dtype) ? options.dtype : e.dtype, true, e.rank});
    }
  }
  // Shards as HF plans them: tensors in order, a new file when the next one would pass the limit.
  std::vector<std::vector<const OutputTensor*>> shards(1);
  int64_t in_shard = 0;
  for (const auto& t : tensors) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(c10::elementSize(t.dtype));
    if (in_shard > 0 && in_shard + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += bytes;
    result.total_bytes += bytes;
    result.largest_tensor_bytes = std::max(result.largest_tensor_bytes, bytes);
  }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw CheckpointError(out_dir + ": cannot create: " + ec.message());
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file = shards.size() == 1 ? "model.safetensors" : name;
    std::vector<TensorInfo> infos;
    for (const auto* t : shards[s]) {
      auto shape = t->shape;
      if (hf && is_hf_gpt2_conv1d_weight(t->name) && shape.size() == 2) std::swap(shape[0], shape[1]);
      infos.push_back({t->name, t->dtype, shape});
    }
    SafetensorsWriter writer((fs::path(out_dir) / file).string(), infos, {{"format", "pt"}});
    for (const auto* t : shards[s]) {
      if (t->module) {
        writer.write(t->name,
                     checkpoint.read(t->file, shard_tensor_name(kModuleKind, t->name)).view(t->shape).to(t->dtype));
      } else {
        auto whole =
            torch::empty({t->numel()}, torch::TensorOptions().dtype(from_param16 ? options.dtype : torch::kFloat32));
        checkpoint.read_range(kind, t->name, 0, whole);
        auto value = whole.view(t->shape).to(options.dtype);
        writer.write(t->name, hf ? to_hf_gpt2(t->name, value) : value);
      }
      weight_map[t->name] = file;
    }
    writer.close();
    result.files.push_back(file);
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", result.total_bytes}}}, {"weight_map", weight_map}};
    write_file_durably((fs::path(out_dir) / "model.safetensors.index.json").string(), index.dump(2));
    result.files.push_back("model.safetensors.index.json");
  }
  if (hf && m.client_state.is_object() && m.client_state.contains("gpt2")) {
    const auto& g = m.client_state["gpt2"];
    nlohmann::json config;
    try {
      config = hf_gpt2_config(g.at("vocab_size"), g.at("block_size"), g.at("n_embd"), g.at("n_layer"), g.at("n_head"),
                              g.at("layer_norm_eps"));
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(checkpoint.tag_dir() + "/" + kManifestFile + ": client_state.gpt2 cannot describe the "
                            "model for config.json: " + e.what());
    }
    config["torch_dtype"] = options.dtype == torch::kFloat32 ? "float32"
                            : options.dtype == torch::kBFloat16 ? "bfloat16" : "float16";
    write_file_durably((fs::path(out_dir) / "config.json").string(), config.dump(2));
    result.files.push_back("config.json");
  }
  return result;
}

}  // namespace dscpp
