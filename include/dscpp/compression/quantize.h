// DeepSpeed Compression's arithmetic: fake quantization (values put on a `bits` grid, kept in the tensor's dtype),
// the top-k mask of pruning, and the packing that stores quantized weights at their bits. Python's compression
// modules (python/dscpp/compression) call these through dscpp._C.compression; the results are DeepSpeed's own
// arithmetic op for op (deepspeed/compression/utils.py, runtime/quantize.py of the releases that had it), so a
// compressed model computes what DeepSpeed's would.
//
// Groups: a tensor is flattened and cut into `groups` equal rows, each with its own scale (numel must divide).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>

namespace dscpp::compression {

enum class QuantKind : int64_t {
  kSymmetric = 0,   // grid {-2^(b-1) .. 2^(b-1)-1} x scale, scale = 2 max|x| / 2^b
  kAsymmetric = 1,  // grid {0 .. 2^b-1} x scale + zero point, scale = (max - min) / 2^b
  kTernary = 2,     // {-a, 0, a}: |x| > 0.7 mean|x| keeps its sign, a = mean |x| over those
  kBinary = 3,      // sign(x) x mean|x|
};

// The quantizer DeepSpeed picks for weights of `bits`: ternary at 2, binary at 1, else symmetric / asymmetric.
QuantKind weight_quantizer(int bits, bool symmetric);

// The fake-quantized tensor (same shape and dtype). With `range` the scales come from it instead of the data: a
// 2-element [min, max] is one group's (static activation calibration), a (groups, 2) one each group's (the whole
// feature range of a token whose features are split over ranks); symmetric / asymmetric only. A group whose values are all equal
// (all zero) comes back unchanged rather than as DeepSpeed's 0/0 NaN. No autograd: see fake_quantize.
torch::Tensor quantize(const torch::Tensor& x, QuantKind kind, int bits, int64_t groups,
                       const std::optional<torch::Tensor>& range = std::nullopt);

// quantize() with a straight-through gradient: the output's gradient passes to x unchanged (DeepSpeed's
// quantizers' backward), so training sees the quantized forward and updates the full-precision weight.
torch::Tensor fake_quantize(const torch::Tensor& x, QuantKind kind, int bits, int64_t groups,
                            const std::optional<torch::Tensor>& range = std::nullopt);

// MoQ's quantizer (weights after the optimizer step): symmetric / asymmetric with optional stochastic rounding
// (uniform noise in [-0.5, 0.5) from `generator`, or torch's default one, added before rounding); ternary / binary
// below 3 bits.
torch::Tensor moq_quantize(const torch::Tensor& x, int bits, int64_t groups, bool symmetric, bool stochastic,
                           std::optional<at::Generator> generator = std::nullopt);

// 1 where `scores` is among the ceil(ratio x numel) largest, 0 elsewhere (DeepSpeed's TopKBinarizer: the same sort,
// so the same ties), with a straight-through gradient to the scores (learned masks train through it).
torch::Tensor topk_mask(const torch::Tensor& scores, double ratio);

// A quantized weight stored at its bits: each group's distinct values in a codebook (at most 256: a quantizer of
// b bits gives 2^b, pruning may add zero), and one code per element packed 8 / storage_bits to a byte.
// unpack() gives the values back bit for bit (a zero's sign aside).
struct PackedWeight {
  torch::Tensor codes;     // uint8, ceil(numel x storage_bits / 8)
  torch::Tensor codebook;  // [groups, 2^storage_bits] in the weight's dtype, each row sorted
  int64_t storage_bits = 8;  // 1, 2, 4 or 8: the fewest that index every group's values
  std::vector<int64_t> shape;

  int64_t bytes() const { return codes.nbytes() + codebook.nbytes(); }
};

// Packs `values` — a tensor already on a grid per group (quantize()'s output, some elements perhaps zeroed by
// pruning) — or nullopt when some group holds more than 256 distinct values or a NaN (then it stays as it is).
std::optional<PackedWeight> pack(const torch::Tensor& values, int64_t groups);
torch::Tensor unpack(const PackedWeight& packed);

}  // namespace dscpp::compression
