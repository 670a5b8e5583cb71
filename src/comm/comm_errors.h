// How a failed collective is told: the operation and its tensor ("all_reduce of 7 x float32"), the backend's reason
// without c10's backtrace, and on a job of several hosts which node was probably lost.
#pragma once

#include <torch/torch.h>

#include <exception>
#include <string>
#include <vector>

namespace dscpp {

// One node of a job on several hosts, as a failed collective's error names it.
struct JobNode {
  int index = 0;         // the node's CROSS_RANK
  std::string host;      // its hostname
  std::string address;   // what its Gloo bound to: an address (or GLOO_SOCKET_IFNAME's interfaces)
  int first_rank = 0;    // its ranks, first_rank..last_rank
  int last_rank = 0;
};

// "float32", "bfloat16", … (torch's Python names rather than c10's "Float").
std::string dtype_name(torch::ScalarType t);
// "all_reduce of 7 x float32".
std::string describe_op(const char* op, const torch::Tensor& t);
// The exception's message without c10's backtrace or a trailing period (the caller appends its own sentence).
std::string reason(const std::exception& e);
// The end of a failed collective's error: who was probably lost. Gloo names the peer's address when a connection
// breaks ("[10.0.0.2]:4123"), not when a wait times out; then every other node is a suspect. `nodes` null: a job on
// one host.
std::string blame(const std::string& error, const std::vector<JobNode>* nodes, int mine);

}  // namespace dscpp
