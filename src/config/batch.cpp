// The batch triangle, solved as DeepSpeed's _set_batch_related_parameters does, but every error
// prints all four numbers so the user sees at once which side is off.
#include "dscpp/config/batch.h"

#include <string>

namespace dscpp {
namespace {

std::string show(std::optional<int64_t> v) { return v ? std::to_string(*v) : std::string("unset"); }

}  // namespace

BatchConfig resolve_batch(std::optional<int64_t> train_batch_size, std::optional<int64_t> micro_batch,
                          std::optional<int64_t> grad_accum, int world_size) {
  const std::string numbers = " (train_batch_size=" + show(train_batch_size) +
                              ", train_micro_batch_size_per_gpu=" + show(micro_batch) +
                              ", gradient_accumulation_steps=" + show(grad_accum) +
                              ", world_size=" + std::to_string(world_size) + ")";
  auto fail = [&](const std::string& why) -> void { throw ConfigError("batch size: " + why + numbers); };
  if (world_size < 1) fail("world_size must be >= 1");
  if (train_batch_size && *train_batch_size <= 0) fail("train_batch_size must be > 0");
  if (micro_batch && *micro_batch <= 0) fail("train_micro_batch_size_per_gpu must be > 0");
  if (grad_accum && *grad_accum <= 0) fail("gradient_accumulation_steps must be > 0");

  const int64_t w = world_size;
  BatchConfig out;
  if (train_batch_size && micro_batch && grad_accum) {
    if (*train_batch_size != *micro_batch * *grad_accum * w) {
      fail("train_batch_size must equal train_micro_batch_size_per_gpu × gradient_accumulation_steps × "
           "world_size = " + std::to_string(*micro_batch * *grad_accum * w));
    }
    out = {*train_batch_size, *micro_batch, *grad_accum};
  } else if (train_batch_size && micro_batch) {
    if (*train_batch_size % (*micro_batch * w) != 0) {
      fail("train_batch_size must be divisible by train_micro_batch_size_per_gpu × world_size = " +
           std::to_string(*micro_batch * w));
    }
    out = {*train_batch_size, *micro_batch, *train_batch_size / (*micro_batch * w)};
  } else if (train_batch_size && grad_accum) {
    if (*train_batch_size % (*grad_accum * w) != 0) {
      fail("train_batch_size must be divisible by gradient_accumulation_steps × world_size = " +
           std::to_string(*grad_accum * w));
    }
    out = {*train_batch_size, *train_batch_size / (*grad_accum * w), *grad_accum};
  } else if (micro_batch && grad_accum) {
    out = {*micro_batch * *grad_accum * w, *micro_batch, *grad_accum};
  } else if (train_batch_size) {
    if (*train_batch_size % w != 0) fail("train_batch_size must be divisible by world_size");
    out = {*train_batch_size, *train_batch_size / w, 1};
  } else if (micro_batch) {
    out = {*micro_batch * w, *micro_batch, 1};
  } else {
    fail("set train_batch_size or train_micro_batch_size_per_gpu (in the config, with --set, or through the "
         "program's HF-style --micro_batch flag)");
  }
  return out;
}

}  // namespace dscpp
