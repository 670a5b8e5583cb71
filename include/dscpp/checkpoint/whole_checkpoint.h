// WholeCheckpoint: a checkpoint held whole in memory — every tensor entire, as one process of one rank would hold
// it — and written in our format as that one rank's file (docs/checkpoint-format.md). It is how a checkpoint from
// elsewhere becomes ours (`dscpp convert --from deepspeed`): the engine's resharding load then reads it at any world
// size, stage and layout, as it reads one written by a single-process run.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>

#include "dscpp/checkpoint/manifest.h"

namespace dscpp {

struct WholeCheckpoint {
  // Everything but `files` and `world_size`, which the writer fills. `params` are the trainable parameters; the
  // optimizer's state kinds are `optimizer_state`.
  Manifest manifest;
  // "<kind>/<name>" → the whole tensor: kMasterKind and each optimizer state kind for every parameter (any shape with
  // the parameter's element count; fp32), kModuleKind for every module_state entry (its shape and dtype).
  std::map<std::string, torch::Tensor> tensors;
};

// Writes `checkpoint` as `out_dir`/<manifest.tag> through the save protocol (staging directory, fsync, rename) and
// names it in `out_dir`/latest. Throws CheckpointError naming the tensor a parameter or module entry lacks, or one
// whose size differs from its entry; nothing under `out_dir` changes then.
void write_whole_checkpoint(WholeCheckpoint checkpoint, const std::string& out_dir);

}  // namespace dscpp
