// Writing one of our checkpoints in DeepSpeed's layout, so real DeepSpeed continues the run (docs/checkpoints.md,
// "Going back to DeepSpeed"): its universal checkpoint — the layout its ds_to_universal writes: a folder per parameter
// (fp32.pt, exp_avg.pt, exp_avg_sq.pt, step.pt, each whole), zero/optimizer_state.pt, and the model states — for any
// world size at ZeRO 1-3 with `"checkpoint": {"load_universal": true}`, or its ZeRO-0 layout. The files are written by
// torch_pickle.h's writer; every tensor is whole, so the checkpoint's writer layout does not matter.
#pragma once

#include <string>

namespace dscpp {

// Which of DeepSpeed's layouts to write. The universal checkpoint loads at every world size and ZeRO stage 1-3;
// DeepSpeed does not load it without ZeRO, where it reads the optimizer's state from the model-states file instead.
enum class DeepSpeedLayout {
  kUniversal,  // ds_to_universal's: load with "checkpoint": {"load_universal": true}
  kZero0,      // ZeRO 0 (fp32): mp_rank_00_model_states.pt holding torch's state_dict of DeepSpeed's FusedAdam
};

struct DeepSpeedExport {
  std::string tag;           // the tag written (the checkpoint's)
  int64_t parameters = 0;    // trainable parameters written
  int64_t elements = 0;      // their elements
};

// Reads `checkpoint_dir`'s tag `tag` ("" = latest) and writes `out_dir`/<tag>/ in `layout`, plus `latest` (and, for
// the universal layout, `latest_universal`) naming it — through a staging directory: a failure leaves nothing.
// Throws CheckpointError naming what is not supported: an optimizer other than Adam / AdamW, fp16, a 16-bit run at
// ZeRO 0, a pipeline- or tensor-parallel writer.
DeepSpeedExport write_deepspeed_checkpoint(const std::string& checkpoint_dir, const std::string& tag,
                                           const std::string& out_dir,
                                           DeepSpeedLayout layout = DeepSpeedLayout::kUniversal);

}  // namespace dscpp
