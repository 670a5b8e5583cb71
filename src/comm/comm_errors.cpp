// Error text for failed collectives (comm_errors.h).
#include "comm_errors.h"

#include <c10/util/Exception.h>

namespace dscpp {
namespace {

std::string node_name(const JobNode& node) {
  return "node " + std::to_string(node.index) + " (host " + node.host + ", " + node.address + "; rank" +
         (node.first_rank == node.last_rank ? " " + std::to_string(node.first_rank)
                                            : "s " + std::to_string(node.first_rank) + "-" +
                                                  std::to_string(node.last_rank)) +
         ")";
}

}  // namespace

std::string dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    case torch::kLong: return "int64";
    case torch::kInt: return "int32";
    case torch::kShort: return "int16";
    case torch::kChar: return "int8";
    case torch::kByte: return "uint8";
    case torch::kBool: return "bool";
    default: return c10::toString(t);
  }
}

std::string describe_op(const char* op, const torch::Tensor& t) {
  return std::string(op) + " of " + std::to_string(t.numel()) + " x " + dtype_name(t.scalar_type());
}

std::string reason(const std::exception& e) {
  auto c10 = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10 ? c10->what_without_backtrace() : e.what();
  while (!text.empty() && (text.back() == '.' || text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string blame(const std::string& error, const std::vector<JobNode>* nodes, int mine) {
  if (nodes == nullptr) return ". A peer rank probably died or is stuck; see its log.";
  for (const auto& node : *nodes) {
    if (node.index != mine && error.find("[" + node.address + "]") != std::string::npos)
      return ". Lost " + node_name(node) + ": its ranks died or its host went away; see its log.";
  }
  std::string others;
  for (const auto& node : *nodes)
    if (node.index != mine) others += (others.empty() ? "" : ", ") + node_name(node);
  return ". A rank on another host probably died, or a host's network went away; the job's other hosts: " + others +
         ".";
}

}  // namespace dscpp
