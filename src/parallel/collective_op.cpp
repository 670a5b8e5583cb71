// collective_op: one autograd node per collective, holding the map of its gradient.
#include "dscpp/parallel/collective_op.h"

#include <utility>

namespace dscpp {
namespace {

class CollectiveBackward final : public torch::autograd::Node {
 public:
  CollectiveBackward(std::string name, TensorMap backward) : name_(std::move(name)), backward_(std::move(backward)) {}
  std::string name() const override { return name_; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads.at(0).defined()) return {torch::Tensor()};
    return {backward_(grads[0])};
  }

 private:
  std::string name_;
  TensorMap backward_;
};

}  // namespace

torch::Tensor collective_op(const torch::Tensor& x, const std::shared_ptr<Comm>& group, const std::string& name,
                            const TensorMap& forward, TensorMap backward) {
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

}  // namespace dscpp
