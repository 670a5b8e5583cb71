// Writing one of our checkpoints as DeepSpeed's universal checkpoint — the layout its ds_to_universal writes: a
// folder per parameter (fp32.pt, exp_avg.pt, exp_avg_sq.pt, step.pt, each whole), zero/optimizer_state.pt, and the
// model states — so real DeepSpeed continues the run at any world size and ZeRO stage 1-3 with
// `"checkpoint": {"load_universal": true}` (docs/checkpoints.md, "Going back to DeepSpeed"). The files are written by
// torch_pickle.h's writer; every tensor is whole, so the checkpoint's writer layout does not matter.
#pragma once

#include <string>

namespace dscpp {

struct DeepSpeedExport {
  std::string tag;           // the tag written (the checkpoint's)
  int64_t parameters = 0;    // trainable parameters written
  int64_t elements = 0;      // their elements
};

// Reads `checkpoint_dir`'s tag `tag` ("" = latest) and writes `out_dir`/<tag>/ plus `latest_universal` and `latest`
// naming it (through a staging directory: a failure leaves nothing). Throws CheckpointError naming what is not
// supported: an optimizer other than Adam / AdamW, fp16, a pipeline- or tensor-parallel writer.
DeepSpeedExport write_deepspeed_universal(const std::string& checkpoint_dir, const std::string& tag,
                                          const std::string& out_dir);

}  // namespace dscpp
