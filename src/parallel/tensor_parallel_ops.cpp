// Each operation computes its forward without autograd and gives the result one backward node that runs the
// transposed collective, holding the group (a c10d group cannot live in an autograd Function's saved IValues).
#include "dscpp/parallel/tensor_parallel_ops.h"

#include <functional>
#include <stdexcept>
#include <string>

namespace dscpp {
namespace {

class CollectiveBackward final : public torch::autograd::Node {
 public:
  CollectiveBackward(std::string name, std::function<torch::Tensor(const torch::Tensor&)> backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  std::string name() const override { return name_; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads.at(0).defined()) return {torch::Tensor()};
    return {backward_(grads[0])};
  }

 private:
  std::string name_;
  std::function<torch::Tensor(const torch::Tensor&)> backward_;
};

using Map = std::function<torch::Tensor(const torch::Tensor&)>;

// `forward(x)` computed without autograd, given one node that maps its gradient to x's by `backward`. Over a group of
// one rank both are the identity, and x comes back as it is.
torch::Tensor collective(const torch::Tensor& x, const std::shared_ptr<Comm>& group, const char* name,
                         const Map& forward, Map backward) {
  if (group->world_size() == 1) return x;
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    out = forward(x);
  }
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) return out;
  auto node = std::shared_ptr<CollectiveBackward>(new CollectiveBackward(name, std::move(backward)),
                                                  torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::create_gradient_edge(out, node);
  return out;
}

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
  return collective(
      x, group, "dscpp::CopyToModelParallelBackward", [](const torch::Tensor& t) { return t.detach(); },
      [group](const torch::Tensor& g) { return all_reduced(g, *group); });
}

torch::Tensor reduce_from_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group) {
  return collective(
      x, group, "dscpp::ReduceFromModelParallelBackward",
      [group](const torch::Tensor& t) { return all_reduced(t, *group); }, [](const torch::Tensor& g) { return g; });
}

torch::Tensor gather_from_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group) {
  return collective(
      x, group, "dscpp::GatherFromModelParallelBackward",
      [group](const torch::Tensor& t) { return gathered_last_dim(t, *group); },
      [group](const torch::Tensor& g) { return slice_last_dim(g, *group); });
}

torch::Tensor scatter_to_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group) {
  return collective(
      x, group, "dscpp::ScatterToModelParallelBackward",
      [group](const torch::Tensor& t) { return slice_last_dim(t, *group); },
      [group](const torch::Tensor& g) { return gathered_last_dim(g, *group); });
}

}  // namespace dscpp
