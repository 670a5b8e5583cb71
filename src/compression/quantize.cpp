// DeepSpeed Compression's quantizers, op for op as DeepSpeed computes them (so the same rounding of the same
// intermediate values), plus what DeepSpeed lacked: groups that are all one value come back unchanged instead of
// 0/0 NaN, and quantized weights can be stored packed at their bits.
#include "dscpp/compression/quantize.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dscpp::compression {
namespace {

torch::Tensor grouped(const torch::Tensor& x, int64_t groups) {
  if (groups < 1 || x.numel() % groups != 0) {
    throw std::invalid_argument("quantize: " + std::to_string(groups) + " groups do not divide the tensor's " +
                                std::to_string(x.numel()) + " elements");
  }
  return x.reshape({groups, -1});
}

// Symmetric: scale = 2 max|x| / 2^b; values round(x / scale) clamped to [-2^(b-1), 2^(b-1) - 1], times scale.
torch::Tensor symmetric(const torch::Tensor& x, int bits, int64_t groups, const torch::Tensor& range) {
  const int64_t q_range = int64_t{1} << bits;
  torch::Tensor input = x;
  torch::Tensor max_input;
  if (range.defined() && range.dim() == 2) {  // each group's [min, max]: max(|min|, max) is its max |x|
    input = grouped(x, groups);
    max_input = torch::max(range.select(1, 0).abs(), range.select(1, 1)).view({groups, -1});
  } else if (range.defined()) {  // static calibration: max(|min|, max) of the running range, one group
    max_input = torch::max(range[0].abs(), range[1]).view(-1);
  } else {
    input = grouped(x, groups);
    max_input = torch::amax(torch::abs(input), {-1}).view({groups, -1});
  }
  const torch::Tensor scale = max_input * 2 / q_range;
  torch::Tensor out = (input / scale).round().clamp(-q_range / 2, q_range / 2 - 1) * scale;
  out = torch::where(scale == 0, input, out);  // all zero: stays zero
  return out.reshape(x.sizes()).contiguous();
}

// Asymmetric: scale = (max - min) / 2^b, zero point = round(min / scale) x scale; values
// round((x - zero point) / scale) clamped to [0, 2^b - 1], times scale, plus the zero point.
torch::Tensor asymmetric(const torch::Tensor& x, int bits, int64_t groups, const torch::Tensor& range) {
  const int64_t q_range = int64_t{1} << bits;
  torch::Tensor input = x, min_value, max_value;
  if (range.defined() && range.dim() == 2) {  // each group's [min, max]
    input = grouped(x, groups);
    min_value = range.select(1, 0).view({groups, 1});
    max_value = range.select(1, 1).view({groups, 1});
  } else if (range.defined()) {
    min_value = range[0];
    max_value = range[1];
  } else {
    input = grouped(x, groups);
    min_value = input.amin({-1}, /*keepdim=*/true);
    max_value = input.amax({-1}, /*keepdim=*/true);
  }
  const torch::Tensor scale = (max_value - min_value) / q_range;
  const torch::Tensor zero_point = (min_value / scale).round() * scale;
  torch::Tensor out = ((input - zero_point) / scale).round().clamp(0, q_range - 1) * scale + zero_point;
  out = torch::where(scale == 0, input, out);  // one value throughout: stays as it is
  return out.reshape(x.sizes()).contiguous();
}

// Ternary: threshold 0.7 x mean|x|; above it +a, below minus it -a, else 0; a = mean |x| of those beyond it.
torch::Tensor ternary(const torch::Tensor& x, int64_t groups) {
  const torch::Tensor flat = grouped(x, groups);
  const int64_t n = flat.size(1);
  const torch::Tensor m = at::linalg_vector_norm(flat, 1, {1}, false, std::nullopt).div(n);
  const torch::Tensor thres = (m * 0.7).view({-1, 1});
  const torch::Tensor pos = (flat > thres).to(x.scalar_type());
  const torch::Tensor neg = (flat < -thres).to(x.scalar_type());
  const torch::Tensor mask = (flat.abs() > thres).to(x.scalar_type());
  const torch::Tensor count = mask.sum({1});
  torch::Tensor alpha = ((mask * flat).abs().sum({1}) / count).view({-1, 1});
  alpha = torch::where(count.view({-1, 1}) == 0, torch::zeros_like(alpha), alpha);  // an all-zero group
  return (alpha * pos - alpha * neg).reshape(x.sizes()).contiguous();
}

// Binary: sign(x) x mean|x|.
torch::Tensor binary(const torch::Tensor& x, int64_t groups) {
  const torch::Tensor flat = grouped(x, groups);
  const int64_t n = flat.size(1);
  const torch::Tensor m = at::linalg_vector_norm(flat, 1, {1}, true, std::nullopt).div(n);
  return flat.sign().mul(m).reshape(x.sizes()).contiguous();
}

void check_bits(int bits, QuantKind kind) {
  const bool ok = (kind == QuantKind::kTernary || kind == QuantKind::kBinary) || (bits >= 1 && bits <= 16);
  if (!ok) throw std::invalid_argument("quantize: bits must be 1 to 16, got " + std::to_string(bits));
}

torch::Tensor quantize_impl(const torch::Tensor& x, QuantKind kind, int bits, int64_t groups,
                            const torch::Tensor& range) {
  check_bits(bits, kind);
  if (range.defined() && (kind == QuantKind::kTernary || kind == QuantKind::kBinary)) {
    throw std::invalid_argument("quantize: a static range is for symmetric / asymmetric quantization only");
  }
  const bool one_range = range.dim() == 1 && range.numel() == 2;
  const bool per_group = range.dim() == 2 && range.size(0) == groups && range.size(1) == 2;
  if (range.defined() && !one_range && !per_group) {
    throw std::invalid_argument("quantize: a range is [min, max] (2) or one per group (" + std::to_string(groups) +
                                ", 2)");
  }
  switch (kind) {
    case QuantKind::kSymmetric: return symmetric(x, bits, groups, range);
    case QuantKind::kAsymmetric: return asymmetric(x, bits, groups, range);
    case QuantKind::kTernary: return ternary(x, groups);
    case QuantKind::kBinary: return binary(x, groups);
  }
  throw std::invalid_argument("quantize: unknown kind");
}

// The straight-through estimator: forward quantizes, backward passes the gradient to x as it is.
class StraightThroughQuantize : public torch::autograd::Function<StraightThroughQuantize> {
 public:
  // `range` is optional (an undefined tensor has no device for autograd's bookkeeping).
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x, int64_t kind, int64_t bits,
                               int64_t groups, const std::optional<torch::Tensor>& range) {
    return quantize_impl(x, static_cast<QuantKind>(kind), static_cast<int>(bits), groups,
                         range.value_or(torch::Tensor()));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class StraightThroughTopK : public torch::autograd::Function<StraightThroughTopK> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& scores, double ratio) {
    torch::Tensor mask = scores.clone();
    const torch::Tensor idx = std::get<1>(scores.flatten().sort(/*dim=*/0, /*descending=*/true));
    const auto keep = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(scores.numel())));
    torch::Tensor flat = mask.view({-1});
    flat.index_put_({idx.slice(0, keep)}, 0.0);
    flat.index_put_({idx.slice(0, 0, keep)}, 1.0);
    return mask;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0].clone(), torch::Tensor()};
  }
};

}  // namespace

QuantKind weight_quantizer(int bits, bool symmetric_type) {
  if (bits == 2) return QuantKind::kTernary;
  if (bits == 1) return QuantKind::kBinary;
  return symmetric_type ? QuantKind::kSymmetric : QuantKind::kAsymmetric;
}

torch::Tensor quantize(const torch::Tensor& x, QuantKind kind, int bits, int64_t groups,
                       const std::optional<torch::Tensor>& range) {
  torch::NoGradGuard no_grad;
  return quantize_impl(x, kind, bits, groups, range.value_or(torch::Tensor()));
}

torch::Tensor fake_quantize(const torch::Tensor& x, QuantKind kind, int bits, int64_t groups,
                            const std::optional<torch::Tensor>& range) {
  return StraightThroughQuantize::apply(x, static_cast<int64_t>(kind), static_cast<int64_t>(bits), groups, range);
}

torch::Tensor moq_quantize(const torch::Tensor& x, int bits, int64_t groups, bool symmetric_type, bool stochastic,
                           std::optional<at::Generator> generator) {
  torch::NoGradGuard no_grad;
  if (bits <= 2) return quantize_impl(x, weight_quantizer(bits, true), bits, groups, torch::Tensor());
  check_bits(bits, QuantKind::kSymmetric);
  const int64_t q_range = int64_t{1} << bits;
  torch::Tensor flat = grouped(x, groups);
  const torch::Tensor g_min = flat.amin({-1}, true);
  const torch::Tensor g_max = flat.amax({-1}, true);
  torch::Tensor noise;
  if (stochastic) noise = torch::empty_like(flat).uniform_(-0.5, 0.5, generator);
  auto jitter = [&](const torch::Tensor& t) { return stochastic ? t + noise : t; };
  torch::Tensor out, scale;
  if (symmetric_type) {
    scale = torch::max(torch::abs(g_min), torch::abs(g_max)) * 2 / q_range;
    out = jitter(flat / scale).round().clamp(-(q_range >> 1), (q_range >> 1) - 1) * scale;
  } else {
    scale = (g_max - g_min) / q_range;
    const torch::Tensor zero_point = (g_min / scale).round() * scale;
    out = jitter((flat - zero_point) / scale).round().clamp(0, q_range - 1) * scale + zero_point;
  }
  out = torch::where(scale == 0, flat, out);
  return out.reshape(x.sizes()).contiguous();
}

torch::Tensor topk_mask(const torch::Tensor& scores, double ratio) {
  if (!(ratio > 0.0 && ratio <= 1.0)) {
    throw std::invalid_argument("topk_mask: the kept ratio must be in (0, 1], got " + std::to_string(ratio));
  }
  return StraightThroughTopK::apply(scores, ratio);
}

std::optional<PackedWeight> pack(const torch::Tensor& values, int64_t groups) {
  torch::NoGradGuard no_grad;
  if (groups < 1 || values.numel() == 0 || values.numel() % groups != 0) return std::nullopt;
  const torch::Tensor rows = grouped(values.detach(), groups);
  if (rows.isnan().any().item<bool>()) return std::nullopt;
  // Each row's distinct values, in order: a value's rank among them is its code.
  const torch::Tensor sorted = std::get<0>(rows.sort(/*dim=*/1));
  const torch::Tensor fresh = torch::cat({torch::ones({groups, 1}, torch::kLong),
                                          (sorted.slice(1, 1) != sorted.slice(1, 0, -1)).to(torch::kLong)}, 1);
  const torch::Tensor rank = fresh.cumsum(1) - 1;
  const int64_t levels = rank.max().item<int64_t>() + 1;
  if (levels > 256) return std::nullopt;
  int64_t storage_bits = 1;
  while ((int64_t{1} << storage_bits) < levels) storage_bits *= 2;
  const int64_t width = int64_t{1} << storage_bits;
  // Unused entries repeat the row's largest value, so the row stays sorted for the search below.
  torch::Tensor codebook = sorted.slice(1, -1).expand({groups, width}).clone();
  codebook.scatter_(1, rank, sorted);
  const torch::Tensor codes = torch::searchsorted(codebook, rows.contiguous()).to(torch::kUInt8).view(-1);
  // Pack 8 / storage_bits codes to a byte, the first in the lowest bits.
  const int64_t per_byte = 8 / storage_bits;
  const int64_t padded = (codes.numel() + per_byte - 1) / per_byte * per_byte;
  torch::Tensor wide = torch::zeros({padded}, torch::kInt32);
  wide.slice(0, 0, codes.numel()).copy_(codes);
  const torch::Tensor shifts = torch::arange(per_byte, torch::kInt32) * storage_bits;
  const torch::Tensor bytes = wide.view({-1, per_byte}).bitwise_left_shift(shifts).sum(1).to(torch::kUInt8);
  PackedWeight packed{bytes, codebook, storage_bits, values.sizes().vec()};
  if (!torch::equal(unpack(packed), values.detach())) return std::nullopt;  // cannot happen; guards the layout
  return packed;
}

torch::Tensor unpack(const PackedWeight& packed) {
  torch::NoGradGuard no_grad;
  const int64_t numel = c10::multiply_integers(packed.shape);
  const int64_t per_byte = 8 / packed.storage_bits;
  const torch::Tensor shifts = torch::arange(per_byte, torch::kInt32) * packed.storage_bits;
  const torch::Tensor codes = packed.codes.to(torch::kInt32)
                                  .unsqueeze(1)
                                  .bitwise_right_shift(shifts)
                                  .bitwise_and((1 << packed.storage_bits) - 1)
                                  .view(-1)
                                  .slice(0, 0, numel)
                                  .to(torch::kLong);
  const int64_t groups = packed.codebook.size(0);
  return packed.codebook.gather(1, codes.view({groups, -1})).view(packed.shape);
}

}  // namespace dscpp::compression
