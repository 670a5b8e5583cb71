// train_schedule: the 1F1B order of one stage (see schedule.h).
#include "dscpp/pipe/schedule.h"

#include <algorithm>
#include <stdexcept>

namespace dscpp {

const char* to_string(PipeOp op) {
  switch (op) {
    case PipeOp::kRecvActivation: return "recv_activation";
    case PipeOp::kForward: return "forward";
    case PipeOp::kSendActivation: return "send_activation";
    case PipeOp::kRecvGrad: return "recv_grad";
    case PipeOp::kBackward: return "backward";
    case PipeOp::kSendGrad: return "send_grad";
  }
  return "?";
}

namespace {

void check_sizes(int stages, int stage, int micro_batches) {
  if (stages < 1 || micro_batches < 1 || stage < 0 || stage >= stages) {
    throw std::invalid_argument("pipeline schedule: stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                                " stages over " + std::to_string(micro_batches) +
                                " micro-batches: need stages >= 1, micro-batches >= 1 and 0 <= stage < stages");
  }
}

}  // namespace

std::vector<PipeInstruction> train_schedule(int stages, int stage, int micro_batches) {
  check_sizes(stages, stage, micro_batches);
  const bool first = stage == 0, last = stage == stages - 1;
  std::vector<PipeInstruction> out;
  auto forward = [&](int micro) {
    if (!first) out.push_back({PipeOp::kRecvActivation, micro});
    out.push_back({PipeOp::kForward, micro});
    if (!last) out.push_back({PipeOp::kSendActivation, micro});
  };
  auto backward = [&](int micro) {
    if (!last) out.push_back({PipeOp::kRecvGrad, micro});
    out.push_back({PipeOp::kBackward, micro});
    if (!first) out.push_back({PipeOp::kSendGrad, micro});
  };
  // Warm-up: the forwards the later stages need before the first gradient can come back.
  const int warmup = std::min(stages - stage - 1, micro_batches);
  for (int micro = 0; micro < warmup; ++micro) forward(micro);
  // Steady state: one forward, then the backward of the oldest micro-batch in flight.
  for (int micro = warmup; micro < micro_batches; ++micro) {
    forward(micro);
    backward(micro - warmup);
  }
  // Cool-down: the backwards of the micro-batches still in flight.
  for (int micro = micro_batches - warmup; micro < micro_batches; ++micro) backward(micro);
  return out;
}

int max_in_flight(int stages, int stage, int micro_batches) {
  check_sizes(stages, stage, micro_batches);
  return std::min(stages - stage, micro_batches);
}

double bubble_fraction(int stages, int micro_batches) {
  check_sizes(stages, 0, micro_batches);
  return static_cast<double>(stages - 1) / (micro_batches + stages - 1);
}

std::string describe(const std::vector<PipeInstruction>& schedule) {
  std::string out;
  for (const auto& i : schedule) {
    const char* letter = "";
    switch (i.op) {
      case PipeOp::kRecvActivation: letter = "R"; break;
      case PipeOp::kForward: letter = "F"; break;
      case PipeOp::kSendActivation: letter = "S"; break;
      case PipeOp::kRecvGrad: letter = "r"; break;
      case PipeOp::kBackward: letter = "B"; break;
      case PipeOp::kSendGrad: letter = "s"; break;
    }
    out += (out.empty() ? "" : " ") + std::string(letter) + std::to_string(i.micro);
  }
  return out;
}

}  // namespace dscpp
