// assemble_param: a byte-wise sum of zero-filled parts (assemble_param.h).
#include "dscpp/zero/assemble_param.h"

namespace dscpp {

torch::Tensor assemble_param(const FlatLayout& layout, int slot, Comm& comm, const torch::TensorOptions& options,
                             const std::function<void(const ShardFragment&, torch::Tensor)>& read_mine) {
  torch::NoGradGuard no_grad;
  const auto& s = layout.slots()[slot];
  auto value = torch::zeros({s.numel}, options);
  if (const auto mine = layout.fragment_of(slot, comm.rank())) {
    read_mine(*mine, value.narrow(0, mine->param_begin, mine->numel));
  }
  auto bytes = value.view(torch::kByte);
  comm.all_reduce(bytes, ReduceOp::kSum).wait();
  return value.view(s.shape);
}

}  // namespace dscpp
