// The GPT's layers for PipelineEngine.
#include "gpt_pipeline.h"

namespace gpt {

dscpp::PipelineModel pipeline_model(const Gpt& model) {
  dscpp::PipelineModel pipe;
  auto gpt = model.ptr();  // the layers keep the model alive
  pipe.layers.push_back({"embed", "Embedding", {{"wte", model->wte.ptr()}, {"wpe", model->wpe.ptr()}},
                         [gpt](const torch::Tensor& idx) { return gpt->embed(idx); }});
  for (size_t i = 0; i < model->blocks().size(); ++i) {
    const Block& block = model->blocks()[i];
    pipe.layers.push_back({"h." + std::to_string(i), "Block", {{"h." + std::to_string(i), block.ptr()}},
                           [unit = block.ptr()](const torch::Tensor& x) { return unit->forward(x); }});
  }
  pipe.layers.push_back({"head", "Head", {{"ln_f", model->ln_f.ptr()}, {"wte", model->wte.ptr()}},
                         [gpt](const torch::Tensor& x) { return gpt->head(x); }});
  pipe.loss_fn = [gpt](const torch::Tensor& logits, const torch::Tensor& targets) {
    return gpt->loss_of_logits(logits, targets);
  };
  return pipe;
}

}  // namespace gpt
