// The GPT as a pipeline model (DeepSpeed's GPT2ModelPipe): the embedding, each block, and the head as layers. The
// head uses the embedding's weight (tied), so with more than one stage the first and last stage each hold a copy.
#pragma once

#include "dscpp/pipe/pipeline_engine.h"
#include "model/gpt.h"

namespace gpt {

// Layers "embed" (type Embedding: wte, wpe → token + position embeddings), "h.<i>" (type Block) and "head" (type
// Head: ln_f, wte → this rank's columns of the logits); the loss is Gpt::loss_of_logits. The layers call the
// model's own modules, so its parameters keep their names and values.
dscpp::PipelineModel pipeline_model(const Gpt& model);

}  // namespace gpt
