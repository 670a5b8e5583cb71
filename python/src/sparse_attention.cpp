// dscpp._C.sparse_attention: DeepSpeed's sparsity layouts (dscpp/sparse_attention/sparsity_config.h) and the
// attention that computes only their blocks (block_sparse_attention.h), for python/dscpp/ops/sparse_attention, whose
// classes are DeepSpeed's. The layouts' random blocks come from the sampler Python passes (its own random.sample), so
// a script's random.seed decides them as it does DeepSpeed's.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <optional>
#include <vector>

#include "dscpp/config/json_reader.h"
#include "dscpp/sparse_attention/block_sparse_attention.h"
#include "dscpp/sparse_attention/python_random.h"
#include "dscpp/sparse_attention/sparsity_config.h"

namespace py = pybind11;

namespace dscpp::python {
namespace {

sparse_attention::AttentionMasks masks(std::optional<double> scale, std::optional<torch::Tensor> rpe,
                                       std::optional<torch::Tensor> key_padding_mask, bool key_padding_mask_mul,
                                       std::optional<torch::Tensor> attn_mask, bool attn_mask_mul, bool causal) {
  sparse_attention::AttentionMasks m;
  m.scale = scale;
  m.rpe = rpe.value_or(torch::Tensor());
  m.key_padding_mask = key_padding_mask.value_or(torch::Tensor());
  m.key_padding_mask_mul = key_padding_mask_mul;
  m.attn_mask = attn_mask.value_or(torch::Tensor());
  m.attn_mask_mul = attn_mask_mul;
  m.causal = causal;
  return m;
}

}  // namespace

void bind_sparse_attention(py::module_& parent) {
  py::module_ m = parent.def_submodule("sparse_attention", "DeepSpeed's block-sparse attention");
  py::class_<SparsityConfig>(m, "SparsityConfig")
      .def(py::init<>())
      .def_readwrite("mode", &SparsityConfig::mode)
      .def_readwrite("num_heads", &SparsityConfig::num_heads)
      .def_readwrite("block", &SparsityConfig::block)
      .def_readwrite("different_layout_per_head", &SparsityConfig::different_layout_per_head)
      .def_readwrite("unidirectional", &SparsityConfig::unidirectional)
      .def_readwrite("num_local_blocks", &SparsityConfig::num_local_blocks)
      .def_readwrite("num_global_blocks", &SparsityConfig::num_global_blocks)
      .def_readwrite("horizontal_global_attention", &SparsityConfig::horizontal_global_attention)
      .def_readwrite("num_different_global_patterns", &SparsityConfig::num_different_global_patterns)
      .def_readwrite("num_random_blocks", &SparsityConfig::num_random_blocks)
      .def_readwrite("local_window_blocks", &SparsityConfig::local_window_blocks)
      .def_readwrite("global_block_indices", &SparsityConfig::global_block_indices)
      .def_readwrite("global_block_end_indices", &SparsityConfig::global_block_end_indices)
      .def_readwrite("num_sliding_window_blocks", &SparsityConfig::num_sliding_window_blocks)
      .def("validate", &SparsityConfig::validate, "The class's checks (ValueError naming the numbers).");
  m.def(
      "parse_config",
      [](const std::string& section_json) {
        nlohmann::json section = nlohmann::json::parse(section_json);
        ParseContext context([](const std::string&) {});
        JsonReader reader(section, "sparse_attention", context);
        return parse_sparse_attention(reader);
      },
      py::arg("section_json"), "The config's sparse_attention section as the C++ parse reads it (ConfigError naming "
                               "the key otherwise); num_heads is the model's to set.");
  m.def(
      "make_layout",
      [](const SparsityConfig& config, int64_t seq_len, const sparse_attention::BlockSampler& sample) {
        return sparse_attention::make_layout(config, seq_len, sample);
      },
      py::arg("config"), py::arg("seq_len"), py::arg("sample") = sparse_attention::BlockSampler(),
      "The (num_heads, seq_len/block, seq_len/block) int64 layout; `sample(n, k)` is random.sample(range(n), k).");
  py::class_<sparse_attention::PythonRandom>(m, "PythonRandom",
                                             "Python's random seeded as random.seed(seed), in C++ (gpt-train's layouts)")
      .def(py::init<uint64_t>(), py::arg("seed"))
      .def("getrandbits", &sparse_attention::PythonRandom::getrandbits, py::arg("bits"))
      .def("sample", &sparse_attention::PythonRandom::sample, py::arg("n"), py::arg("k"));
  py::class_<sparse_attention::BlockSparsePlan>(
      m, "BlockSparsePlan", "A layout made ready to compute with, once per layout and sequence length")
      .def(py::init<const torch::Tensor&, int64_t, bool, torch::Device>(), py::arg("layout"), py::arg("block"),
           py::arg("causal") = false, py::arg("device") = torch::Device(torch::kCPU))
      .def_property_readonly("scored_blocks", &sparse_attention::BlockSparsePlan::scored_blocks)
      .def_property_readonly("heads", &sparse_attention::BlockSparsePlan::heads)
      .def_property_readonly("blocks", &sparse_attention::BlockSparsePlan::blocks);
  m.def(
      "block_sparse_attention_planned",
      [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
         const sparse_attention::BlockSparsePlan& plan, std::optional<double> scale, std::optional<torch::Tensor> rpe,
         std::optional<torch::Tensor> key_padding_mask, bool key_padding_mask_mul,
         std::optional<torch::Tensor> attn_mask, bool attn_mask_mul) {
        return sparse_attention::block_sparse_attention(
            q, k, v, plan,
            masks(scale, rpe, key_padding_mask, key_padding_mask_mul, attn_mask, attn_mask_mul, plan.causal()));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("plan"), py::arg("scale") = py::none(),
      py::arg("rpe") = py::none(), py::arg("key_padding_mask") = py::none(), py::arg("key_padding_mask_mul") = false,
      py::arg("attn_mask") = py::none(), py::arg("attn_mask_mul") = true,
      "block_sparse_attention over a BlockSparsePlan (its causal flag).");
  const auto attention = [](auto f) {
    return [f](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& layout,
               int64_t block, std::optional<double> scale, std::optional<torch::Tensor> rpe,
               std::optional<torch::Tensor> key_padding_mask, bool key_padding_mask_mul,
               std::optional<torch::Tensor> attn_mask, bool attn_mask_mul, bool causal) {
      return f(q, k, v, layout, block,
               masks(scale, rpe, key_padding_mask, key_padding_mask_mul, attn_mask, attn_mask_mul, causal));
    };
  };
  const auto args = [] {
    return std::make_tuple(py::arg("q"), py::arg("k"), py::arg("v"), py::arg("layout"), py::arg("block"),
                           py::arg("scale") = py::none(), py::arg("rpe") = py::none(),
                           py::arg("key_padding_mask") = py::none(), py::arg("key_padding_mask_mul") = false,
                           py::arg("attn_mask") = py::none(), py::arg("attn_mask_mul") = true,
                           py::arg("causal") = false);
  };
  std::apply([&](auto... a) {
    using WithLayout = torch::Tensor (*)(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                         const torch::Tensor&, int64_t, const sparse_attention::AttentionMasks&);
    m.def("block_sparse_attention", attention(static_cast<WithLayout>(&sparse_attention::block_sparse_attention)), a...,
          "softmax(scale·QKᵀ + masks)·V on the layout's blocks only; q, k, v (B, H, T, D). Differentiable.");
  }, args());
  std::apply([&](auto... a) {
    m.def("masked_dense_attention", attention(&sparse_attention::masked_dense_attention), a...,
          "The same attention computed densely, everything outside the layout at -inf (the reference).");
  }, args());
}

}  // namespace dscpp::python
