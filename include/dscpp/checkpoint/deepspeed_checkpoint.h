// Reading a checkpoint that real DeepSpeed's engine.save_checkpoint wrote — a tag directory (global_stepN/) holding
// mp_rank_00_model_states.pt and, under ZeRO, one zero_pp_rank_R_mp_rank_00_optim_states.pt per data-parallel rank —
// into a WholeCheckpoint: each trainable parameter's fp32 master and Adam moments reassembled whole from every rank's
// partition, the step counters, the schedule's position, the loss scaler, buffers and frozen parameters, and the
// client state. `dscpp convert --from deepspeed` writes that as one of our checkpoints, which a run then loads at any
// world size and stage (docs/checkpoints.md, "Coming from DeepSpeed").
//
// The files are read by torch_pickle.h's reader: tensors, containers and DeepSpeed's few plain objects, nothing
// executed. Layouts read: ZeRO 0 (fp32; its optimizer state names no parameters, so one param group over the
// module's parameters in order), ZeRO 1 and 2 (one flat partition per param group per rank, optional
// per-parameter alignment padding), ZeRO 3 (each parameter split in equal padded pieces, one per rank, sub-groups
// concatenated) and DeepSpeed's universal format (ds_to_universal's folder per parameter; its tag in
// `latest_universal`), with DeepSpeed's Adam / AdamW. Anything else (pipeline or tensor-parallel files, MoE experts,
// another optimizer's state, a 16-bit run at stage 0) stops with what is not supported.
#pragma once

#include <string>

#include "dscpp/checkpoint/whole_checkpoint.h"

namespace dscpp {

// `dir`'s tag `tag` ("" = the one `dir`/latest names) as a WholeCheckpoint whose manifest's tag is that tag. Throws
// CheckpointError naming the file and what is missing, inconsistent or not supported.
WholeCheckpoint read_deepspeed_checkpoint(const std::string& dir, const std::string& tag = "");

// True when `tag_dir` looks like a DeepSpeed tag (it holds *model_states.pt and no manifest.json): a load pointed at
// one says how to convert it instead of failing on the missing manifest.
bool is_deepspeed_tag_dir(const std::string& tag_dir);

}  // namespace dscpp
