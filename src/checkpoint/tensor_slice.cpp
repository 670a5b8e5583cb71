// TensorSlice: the slice's shape, and copies between it and the whole tensor, piece by piece.
#include "dscpp/checkpoint/tensor_slice.h"

#include <stdexcept>

namespace dscpp {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) { return c10::str(c10::IntArrayRef(shape)); }

void validate(const TensorSlice& s) {
  const auto rank = static_cast<int64_t>(s.whole_shape.size());
  if (s.dim < 0 || s.dim >= rank) {
    throw std::invalid_argument("tensor slice: dim " + std::to_string(s.dim) + " is outside a tensor of shape " +
                                shape_text(s.whole_shape));
  }
  for (const auto& [begin, length] : s.pieces) {
    if (begin < 0 || length <= 0 || begin > s.whole_shape[s.dim] - length) {
      throw std::invalid_argument("tensor slice: piece [" + std::to_string(begin) + ", +" + std::to_string(length) +
                                  ") is outside dimension " + std::to_string(s.dim) + " of " +
                                  shape_text(s.whole_shape));
    }
  }
  if (s.pieces.empty()) throw std::invalid_argument("tensor slice: no pieces");
}

}  // namespace

TensorSlice TensorSlice::part(std::vector<int64_t> whole_shape, int64_t dim, int parts, int index, int blocks) {
  if (dim < 0 || dim >= static_cast<int64_t>(whole_shape.size()) || parts < 1 || blocks < 1 || index < 0 ||
      index >= parts) {
    throw std::invalid_argument("tensor slice: part " + std::to_string(index) + " of " + std::to_string(parts) +
                                " along dim " + std::to_string(dim) + " of " + shape_text(whole_shape) +
                                " is not a part");
  }
  const int64_t size = whole_shape[dim];
  if (size % (static_cast<int64_t>(parts) * blocks) != 0) {
    throw std::invalid_argument("tensor slice: dimension " + std::to_string(dim) + " of " + shape_text(whole_shape) +
                                " (" + std::to_string(size) + ") does not divide into " + std::to_string(blocks) +
                                " blocks of " + std::to_string(parts) + " parts");
  }
  TensorSlice s{dim, std::move(whole_shape), {}};
  const int64_t block = size / blocks, length = block / parts;
  for (int b = 0; b < blocks; ++b) s.pieces.emplace_back(b * block + index * length, length);
  return s;
}

std::vector<int64_t> TensorSlice::shape() const {
  auto out = whole_shape;
  out[dim] = 0;
  for (const auto& piece : pieces) out[dim] += piece.second;
  return out;
}

int64_t TensorSlice::numel() const {
  int64_t n = 1;
  for (int64_t d : shape()) n *= d;
  return n;
}

int64_t TensorSlice::whole_numel() const {
  int64_t n = 1;
  for (int64_t d : whole_shape) n *= d;
  return n;
}

torch::Tensor TensorSlice::take(const torch::Tensor& whole) const {
  const auto w = whole.view(whole_shape);
  std::vector<torch::Tensor> parts;
  for (const auto& [begin, length] : pieces) parts.push_back(w.narrow(dim, begin, length));
  return torch::cat(parts, dim).contiguous();
}

void TensorSlice::put(const torch::Tensor& local, torch::Tensor& whole) const {
  auto w = whole.view(whole_shape);
  const auto l = local.view(shape());
  int64_t at = 0;
  for (const auto& [begin, length] : pieces) {
    w.narrow(dim, begin, length).copy_(l.narrow(dim, at, length));
    at += length;
  }
}

nlohmann::json TensorSlice::to_json() const {
  nlohmann::json p = nlohmann::json::array();
  for (const auto& [begin, length] : pieces) p.push_back({begin, length});
  return {{"dim", dim}, {"whole_shape", whole_shape}, {"pieces", p}};
}

TensorSlice TensorSlice::from_json(const nlohmann::json& json) {
  TensorSlice s;
  try {
    s.dim = json.at("dim").get<int64_t>();
    s.whole_shape = json.at("whole_shape").get<std::vector<int64_t>>();
    for (const auto& p : json.at("pieces")) s.pieces.emplace_back(p.at(0).get<int64_t>(), p.at(1).get<int64_t>());
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument("tensor slice: not {\"dim\", \"whole_shape\", \"pieces\": [[begin, length], …]}: " +
                                json.dump());
  }
  validate(s);
  return s;
}

}  // namespace dscpp
