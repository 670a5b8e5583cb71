// dscpp._C.compression: DeepSpeed Compression's arithmetic (dscpp/compression/quantize.h) and the parse of its config
// section, for python/dscpp/compression, whose modules wrap the model's own layers. One parser and one set of
// quantizers serve both front ends.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dscpp/compression/quantize.h"
#include "dscpp/compression/schedule.h"
#include "dscpp/config/compression.h"
#include "dscpp/config/json_reader.h"

namespace py = pybind11;

namespace dscpp::python {

void bind_compression(py::module_& parent) {
  using compression::QuantKind;
  py::module_ m = parent.def_submodule("compression", "DeepSpeed Compression's quantizers, masks and config");
  m.attr("SYMMETRIC") = static_cast<int64_t>(QuantKind::kSymmetric);
  m.attr("ASYMMETRIC") = static_cast<int64_t>(QuantKind::kAsymmetric);
  m.attr("TERNARY") = static_cast<int64_t>(QuantKind::kTernary);
  m.attr("BINARY") = static_cast<int64_t>(QuantKind::kBinary);
  m.def(
      "parse_config",
      [](const std::string& section_json) {
        nlohmann::json section = nlohmann::json::parse(section_json);
        ParseContext context([](const std::string&) {});
        JsonReader reader(section, "compression_training", context);
        const CompressionConfig parsed = parse_compression(reader);
        return std::make_tuple(section.dump(), parsed.any_enabled());
      },
      py::arg("section_json"),
      "compression_training's section checked, with every default written out: (resolved JSON text, whether any "
      "technique is on). ConfigError naming the key otherwise.");
  // The schedule (dscpp/compression/schedule.h), the one gpt-train's layers follow too.
  py::class_<CompressionConfig>(m, "Schedule")
      .def(py::init([](const std::string& section_json) {
             nlohmann::json section = nlohmann::json::parse(section_json);
             ParseContext context([](const std::string&) {});
             JsonReader reader(section, "compression_training", context);
             return parse_compression(reader);
           }),
           py::arg("section_json"), "The schedule of a compression_training section (JSON text).")
      .def(
          "on",
          [](const CompressionConfig& config, const std::string& technique, int64_t applied_steps) {
            for (auto t : compression::kTechniques) {
              if (compression::technique_key(t) == technique) return compression::technique_on(config, t, applied_steps);
            }
            throw std::invalid_argument("unknown compression technique '" + technique + "'");
          },
          py::arg("technique"), py::arg("applied_steps"),
          "Whether the technique acts after `applied_steps` applied optimizer steps.");
  m.def(
      "moq_advance",
      [](int bits, int target, int64_t period, int64_t quantize_step) {
        compression::MoqBits moq{bits, target, period};
        const bool dropped = moq.advance(quantize_step);
        return std::make_tuple(moq.bits, moq.period, dropped);
      },
      py::arg("bits"), py::arg("target"), py::arg("period"), py::arg("quantize_step"),
      "MoQ's (bits, period, dropped) after quantize call `quantize_step` (from 1).");
  m.def(
      "weight_quantizer", [](int bits, bool symmetric) { return static_cast<int64_t>(
                                                             compression::weight_quantizer(bits, symmetric)); },
      py::arg("bits"), py::arg("symmetric"), "The kind DeepSpeed quantizes weights of `bits` with.");
  m.def(
      "quantize",
      [](const torch::Tensor& x, int64_t kind, int bits, int64_t groups, std::optional<torch::Tensor> range) {
        return compression::quantize(x, static_cast<QuantKind>(kind), bits, groups, range);
      },
      py::arg("x"), py::arg("kind"), py::arg("bits"), py::arg("groups") = 1, py::arg("range") = py::none(),
      "Fake-quantized x (no autograd).");
  m.def(
      "fake_quantize",
      [](const torch::Tensor& x, int64_t kind, int bits, int64_t groups, std::optional<torch::Tensor> range) {
        return compression::fake_quantize(x, static_cast<QuantKind>(kind), bits, groups, range);
      },
      py::arg("x"), py::arg("kind"), py::arg("bits"), py::arg("groups") = 1, py::arg("range") = py::none(),
      "Fake-quantized x whose gradient passes straight through to x.");
  m.def(
      "moq_quantize",
      [](const torch::Tensor& x, int bits, int64_t groups, bool symmetric, bool stochastic) {
        return compression::moq_quantize(x, bits, groups, symmetric, stochastic);
      },
      py::arg("x"), py::arg("bits"), py::arg("groups"), py::arg("symmetric"), py::arg("stochastic"),
      "MoQ's quantizer (stochastic rounding draws from torch's default generator).");
  m.def("topk_mask", &compression::topk_mask, py::arg("scores"), py::arg("ratio"),
        "1 for the ceil(ratio x numel) largest scores, else 0; the gradient passes to the scores.");
  m.def(
      "pack",
      [](const torch::Tensor& values, int64_t groups) -> std::optional<std::tuple<torch::Tensor, torch::Tensor, int64_t>> {
        auto packed = compression::pack(values, groups);
        if (!packed) return std::nullopt;
        return std::make_tuple(packed->codes, packed->codebook, packed->storage_bits);
      },
      py::arg("values"), py::arg("groups"),
      "(codes, codebook, storage_bits) storing quantized values at their bits, or None when a group has more "
      "than 256 distinct values.");
  m.def(
      "unpack",
      [](const torch::Tensor& codes, const torch::Tensor& codebook, int64_t storage_bits,
         const std::vector<int64_t>& shape) {
        return compression::unpack({codes, codebook, storage_bits, shape});
      },
      py::arg("codes"), py::arg("codebook"), py::arg("storage_bits"), py::arg("shape"), "pack's values back.");
}

}  // namespace dscpp::python
