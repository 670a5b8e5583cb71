// Writing one of our checkpoints in DeepSpeed's layout, so real DeepSpeed continues the run (docs/checkpoints.md,
// "Going back to DeepSpeed"): its universal checkpoint — the layout its ds_to_universal writes: a folder per
// parameter (fp32.pt, exp_avg.pt, exp_avg_sq.pt, step.pt, each whole), zero/optimizer_state.pt, and the model
// states — for any world size at ZeRO 1-3 with `"checkpoint": {"load_universal": true}`, or the files DeepSpeed
// itself saves at one ZeRO stage and data-parallel world size. The files are written by torch_pickle.h's writer;
// every tensor is read whole from our checkpoint, so the checkpoint's writer layout does not matter.
#pragma once

#include <cstdint>
#include <string>

namespace dscpp {

// Which of DeepSpeed's layouts to write.
struct DeepSpeedLayout {
  // ds_to_universal's layout: loads at every world size and ZeRO stage 1-3, trainable parameters only.
  static DeepSpeedLayout universal() { return {}; }
  // The files DeepSpeed saves at ZeRO `stage` (0-3) on `world_size` data-parallel ranks: the module's buffers and
  // frozen parameters included, loaded by DeepSpeed at that stage and that world size only (it refuses another;
  // at ZeRO 0 there is no partition and any world size loads it); 0: the saving run's. Stage 0 is written for fp32
  // runs.
  static DeepSpeedLayout zero(int stage, int world_size = 0) { return {false, stage, world_size}; }

  bool is_universal = true;
  int zero_stage = 0;
  int world_size = 0;
};

struct DeepSpeedExport {
  std::string tag;           // the tag written (the checkpoint's)
  int64_t parameters = 0;    // trainable parameters written
  int64_t elements = 0;      // their elements
  int64_t files = 0;         // .pt files written
  int world_size = 0;        // the data-parallel world size DeepSpeed's ZeRO files are cut for
};

// Reads `checkpoint_dir`'s tag `tag` ("" = latest) and writes `out_dir`/<tag>/ in `layout`, plus `latest` (and, for
// the universal layout, `latest_universal`) naming it — through a staging directory: a failure leaves nothing.
// Throws CheckpointError naming what is not supported: an optimizer other than Adam / AdamW, fp16, a 16-bit run at
// ZeRO 0, a pipeline- or tensor-parallel writer, buffers or frozen parameters in the universal layout; and
// std::invalid_argument for a stage outside 0-3 or a negative world size.
DeepSpeedExport write_deepspeed_checkpoint(const std::string& checkpoint_dir, const std::string& tag,
                                           const std::string& out_dir,
                                           DeepSpeedLayout layout = DeepSpeedLayout::universal());

}  // namespace dscpp
