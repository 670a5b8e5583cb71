// Each operation is a collective_op: its forward without autograd, its backward the transposed collective.
#include "dscpp/parallel/tensor_parallel_ops.h"

#include <functional>
#include <stdexcept>
#include <string>

#include "dscpp/parallel/collective_op.h"

namespace dscpp {
namespace {

torch::Tensor all_reduced(const torch::Tensor& x, Comm& group) {
  auto out = x.contiguous().clone();
  group.all_reduce(out).wait();
  return out;
}

// (…, n) on each rank → (…, n · size), ranks side by side along the last dimension.
torch::Tensor gathered_last_dim(const torch::Tensor& x, Comm& group) {
  const int size = group.world_size();
  auto part = x.contiguous();
  auto flat = torch::empty({size * part.numel()}, part.options());
  group.all_gather(flat, part.view({-1})).wait();
  std::vector<int64_t> stacked{size};
  for (auto d : part.sizes()) stacked.push_back(d);
  auto out_sizes = part.sizes().vec();
  out_sizes.back() *= size;
  return flat.view(stacked).movedim(0, -2).reshape(out_sizes);
}

torch::Tensor slice_last_dim(const torch::Tensor& x, Comm& group) {
  const int64_t n = x.size(-1), size = group.world_size();
  if (n % size != 0) {
    throw std::invalid_argument("scatter_to_model_parallel: the last dimension (" + std::to_string(n) +
                                ") does not divide over the " + std::to_string(size) + " model-parallel ranks");
  }
  const int64_t part = n / size;
  return x.narrow(-1, group.rank() * part, part).clone(at::MemoryFormat::Contiguous);  // a tensor of its own
}

}  // namespace

torch::Tensor copy_to_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group) {
  return collective_op(
      x, group, "dscpp::CopyToModelParallelBackward", [](const torch::Tensor& t) { return t.detach(); },
      [group](const torch::Tensor& g) { return all_reduced(g, *group); });
}

torch::Tensor reduce_from_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group) {
  return collective_op(
      x, group, "dscpp::ReduceFromModelParallelBackward",
      [group](const torch::Tensor& t) { return all_reduced(t, *group); }, [](const torch::Tensor& g) { return g; });
}

torch::Tensor gather_from_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group) {
  return collective_op(
      x, group, "dscpp::GatherFromModelParallelBackward",
      [group](const torch::Tensor& t) { return gathered_last_dim(t, *group); },
      [group](const torch::Tensor& g) { return slice_last_dim(g, *group); });
}

torch::Tensor scatter_to_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group) {
  return collective_op(
      x, group, "dscpp::ScatterToModelParallelBackward",
      [group](const torch::Tensor& t) { return slice_last_dim(t, *group); },
      [group](const torch::Tensor& g) { return gathered_last_dim(g, *group); });
}

}  // namespace dscpp
