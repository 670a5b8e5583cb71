// The device the engine, ZeRO, offload, checkpoint and activation tests train on, from one place:
// DSCPP_TEST_DEVICE=cuda runs the same tests on this rank's GPU (cuda:LOCAL_RANK, through dscpp::rank_device), unset
// or "cpu" keeps them on the CPU. A GPU that is asked for and missing fails the test rather than quietly testing the
// CPU again.
#pragma once

#include <cstdlib>
#include <string>

#include "dscpp/engine/device.h"

namespace dscpp::testing {

// "cpu" or "cuda" as DSCPP_TEST_DEVICE says; anything else throws std::invalid_argument naming the variable.
inline std::string test_device_name() {
  const char* value = std::getenv("DSCPP_TEST_DEVICE");
  const std::string name = value && *value ? value : "cpu";
  if (name != "cpu" && name != "cuda") {
    throw std::invalid_argument("DSCPP_TEST_DEVICE=" + name + ": expected cpu or cuda");
  }
  return name;
}

inline torch::Device test_device() {
  const char* local_rank = std::getenv("LOCAL_RANK");
  return rank_device(test_device_name(), local_rank ? std::atoi(local_rank) : 0);
}

// gpt-train on the test device, as the process tests start it (more arguments follow).
inline std::string gpt_train_command() {
  return std::string(DSCPP_BINARY_DIR) + "/gpt-train --device " + test_device_name();
}

}  // namespace dscpp::testing
