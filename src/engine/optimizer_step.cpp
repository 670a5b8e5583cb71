// The two places an optimizer step can run (optimizer_step.h).
#include "dscpp/engine/optimizer_step.h"

namespace dscpp {
namespace {

class InPlaceStep final : public OptimizerStep {
 public:
  InPlaceStep(FlatOptimizer& optimizer, ZeroStage& stage) : optimizer_(optimizer), stage_(stage) {}
  void run(const torch::Tensor& grads, double lr) override {
    optimizer_.step(stage_.master_params(), grads, lr);
    stage_.publish_params();
  }

 private:
  FlatOptimizer& optimizer_;
  ZeroStage& stage_;
};

class OffloadedStep final : public OptimizerStep {
 public:
  explicit OffloadedStep(std::unique_ptr<OptimizerOffload> offload) : offload_(std::move(offload)) {}
  void run(const torch::Tensor& grads, double lr) override { offload_->step(grads, lr); }
  OptimizerOffload* offload() override { return offload_.get(); }

 private:
  std::unique_ptr<OptimizerOffload> offload_;
};

}  // namespace

std::unique_ptr<OptimizerStep> make_in_place_step(FlatOptimizer& optimizer, ZeroStage& stage) {
  return std::make_unique<InPlaceStep>(optimizer, stage);
}

std::unique_ptr<OptimizerStep> make_offloaded_step(std::unique_ptr<OptimizerOffload> offload) {
  return std::make_unique<OffloadedStep>(std::move(offload));
}

}  // namespace dscpp
