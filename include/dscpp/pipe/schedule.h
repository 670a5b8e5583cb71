// The pipeline's training schedule: what one stage does, in order, for one global batch of micro-batches —
// DeepSpeed's TrainSchedule (PipeDream-Flush's one-forward-one-backward). Stage s of p first runs p − s − 1 forwards
// (warm-up), then alternates one forward and one backward, then runs the backwards left (cool-down). So a stage keeps
// at most p − s micro-batches' activations alive, however many micro-batches the batch has, and every stage finishes
// its backwards before the optimizer step (the flush). Pure logic: the engine executes it (PipelineEngine).
#pragma once

#include <string>
#include <vector>

namespace dscpp {

enum class PipeOp {
  kRecvActivation,  // the previous stage's output for this micro-batch (not on the first stage)
  kForward,         // the stage's layers on it (the last stage also computes the loss)
  kSendActivation,  // the output to the next stage (not on the last stage)
  kRecvGrad,        // the gradient of the output, from the next stage (not on the last stage)
  kBackward,        // autograd through the stage's layers (from the loss on the last stage)
  kSendGrad,        // the gradient of the input to the previous stage (not on the first stage)
};
const char* to_string(PipeOp op);

struct PipeInstruction {
  PipeOp op;
  int micro;  // the micro-batch, 0 … micro_batches − 1
  bool operator==(const PipeInstruction& o) const { return op == o.op && micro == o.micro; }
};

// Stage `stage` of `stages` over `micro_batches` micro-batches. Sends never wait for their receiver (Comm::send
// returns at once), so every receive this schedule posts is matched by a send its peer has already reached or
// reaches without waiting on this stage: the schedule cannot deadlock. std::invalid_argument for sizes < 1 or a
// stage outside [0, stages).
std::vector<PipeInstruction> train_schedule(int stages, int stage, int micro_batches);

// The most micro-batches whose activations `stage` holds at once under train_schedule: min(stages − stage,
// micro_batches).
int max_in_flight(int stages, int stage, int micro_batches);

// The idle share of a stage's time in a 1F1B step with equal stage times: (p − 1) / (m + p − 1).
double bubble_fraction(int stages, int micro_batches);

// "F0 F1 B0 …": a schedule in short form (R/S for receive/send of activations, r/s of gradients), for logs and tests.
std::string describe(const std::vector<PipeInstruction>& schedule);

}  // namespace dscpp
