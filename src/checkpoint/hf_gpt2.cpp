// HF GPT-2 names and layouts.
#include "dscpp/checkpoint/hf_gpt2.h"

#include <filesystem>
#include <fstream>
#include <set>

namespace fs = std::filesystem;

namespace dscpp {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Our name for a stored HF name, or "" for the non-parameters HF files carry.
std::string our_name(const std::string& stored) {
  std::string name = stored.rfind("transformer.", 0) == 0 ? stored.substr(12) : stored;
  if (name == "lm_head.weight" || ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) return "";
  return name;
}

}  // namespace

bool is_hf_gpt2_conv1d_weight(const std::string& name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

torch::Tensor to_hf_gpt2(const std::string& name, const torch::Tensor& value) {
  return is_hf_gpt2_conv1d_weight(name) ? value.t().contiguous() : value;
}

HfGpt2Weights::HfGpt2Weights(const std::string& path) : path_(path) {
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    const auto index = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(index)) {
      std::ifstream in(index);
      nlohmann::json json;
      try {
        json = nlohmann::json::parse(in);
      } catch (const std::exception& e) {
        throw std::runtime_error(index.string() + ": not valid JSON (" + e.what() + ")");
      }
      if (!json.contains("weight_map") || !json["weight_map"].is_object()) {
        throw std::runtime_error(index.string() + ": no \"weight_map\" object");
      }
      std::set<std::string> unique;
      for (const auto& [name, file] : json["weight_map"].items()) {
        // The index names files beside it: a path elsewhere ("../x", "/etc/x") is refused, not opened. (Links are
        // allowed: the Hugging Face cache makes every snapshot file one.)
        const std::string text = file.is_string() ? file.get<std::string>() : std::string();
        if (text.empty() || text.find('/') != std::string::npos || text[0] == '.') {
          throw std::runtime_error(index.string() + ": weight_map[\"" + name + "\"] is " + file.dump() +
                                   "; it must be the name of a file beside the index");
        }
        unique.insert(text);
      }
      for (const auto& file : unique) files.push_back((fs::path(path) / file).string());
    } else if (fs::exists(fs::path(path) / "model.safetensors")) {
      files.push_back((fs::path(path) / "model.safetensors").string());
    } else {
      throw std::runtime_error(path + ": holds neither model.safetensors nor model.safetensors.index.json");
    }
  } else {
    if (!fs::exists(path)) throw std::runtime_error(path + ": no such file");
    files.push_back(path);
  }
  for (const auto& file : files) {
    files_.push_back(std::make_unique<SafetensorsReader>(file));
    for (const auto& stored : files_.back()->tensors()) {
      const auto name = our_name(stored.info.name);
      if (name.empty()) continue;
      if (!params_.emplace(name, Location{files_.size() - 1, stored.info.name}).second) {
        throw std::runtime_error(file + ": parameter '" + name + "' appears twice in " + path);
      }
    }
  }
}

std::vector<std::string> HfGpt2Weights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, location] : params_) out.push_back(name);
  return out;
}

torch::Tensor HfGpt2Weights::read(const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = params_.find(name);
  if (it == params_.end()) throw std::runtime_error(path_ + ": has no parameter '" + name + "' (HF GPT-2 names)");
  const auto& file = *files_[it->second.file];
  auto value = file.read(it->second.stored_name);
  if (is_hf_gpt2_conv1d_weight(name) && value.dim() == 2) value = value.t().contiguous();
  if (value.sizes().vec() != shape) {
    throw std::runtime_error(file.path() + ": parameter '" + name + "' is " + c10::str(value.sizes()) +
                             " (in our layout), the model's is " + c10::str(c10::IntArrayRef(shape)));
  }
  return value;
}

nlohmann::json hf_gpt2_config(int64_t vocab_size, int64_t n_positions, int64_t n_embd, int64_t n_layer,
                              int64_t n_head, double layer_norm_epsilon) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", vocab_size},
          {"n_positions", n_positions},
          {"n_ctx", n_positions},
          {"n_embd", n_embd},
          {"n_layer", n_layer},
          {"n_head", n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", layer_norm_epsilon},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", 0.02},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"}};
}

}  // namespace dscpp
