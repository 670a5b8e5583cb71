// Ulysses' all-to-all and the attention around it (distributed_attention.h).
#include "dscpp/sequence/distributed_attention.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "dscpp/parallel/collective_op.h"

namespace dscpp {
namespace {

// The exchange itself, without autograd: chunk j of `x` along `scatter` to rank j, the received chunks side by side
// along `gather` in rank order.
torch::Tensor exchange(const torch::Tensor& x, Comm& group, int64_t scatter, int64_t gather) {
  const int64_t parts = group.world_size();
  // [P, chunk...]: the rank-major chunks Comm::all_to_all sends, flat (stack keeps a transposed input's strides, and
  // empty_like would copy them).
  auto outgoing = torch::stack(x.chunk(parts, scatter), 0).contiguous();
  auto incoming = torch::empty(outgoing.sizes(), outgoing.options());
  group.all_to_all(incoming, outgoing).wait();
  return torch::cat(incoming.unbind(0), gather);
}

}  // namespace

torch::Tensor seq_all_to_all(const torch::Tensor& input, const std::shared_ptr<Comm>& group, int64_t scatter_dim,
                             int64_t gather_dim) {
  const int64_t dims = input.dim();
  if (scatter_dim < -dims || scatter_dim >= dims || gather_dim < -dims || gather_dim >= dims) {
    throw std::invalid_argument("seq_all_to_all: scatter_dim " + std::to_string(scatter_dim) + " and gather_dim " +
                                std::to_string(gather_dim) + " must be dimensions of the " + std::to_string(dims) +
                                "-dimensional input");
  }
  const int64_t scatter = (scatter_dim + dims) % dims, gather = (gather_dim + dims) % dims;
  const int64_t parts = group->world_size();
  if (input.size(scatter) % parts != 0) {
    throw std::invalid_argument("seq_all_to_all: dimension " + std::to_string(scatter) + " of " +
                                c10::str(input.sizes()) + " (" + std::to_string(input.size(scatter)) +
                                ") does not split into the sequence-parallel size " + std::to_string(parts));
  }
  // The backward map holds the group: the autograd node may outlive the caller's reference.
  return collective_op(
      input, group, "dscpp::SeqAllToAllBackward",
      [group, scatter, gather](const torch::Tensor& x) { return exchange(x, *group, scatter, gather); },
      [group, scatter, gather](const torch::Tensor& g) { return exchange(g, *group, gather, scatter); });
}

DistributedAttention::DistributedAttention(LocalAttention local_attention, std::shared_ptr<Comm> sequence_group)
    : local_attention_(std::move(local_attention)), group_(std::move(sequence_group)) {
  if (!local_attention_) throw std::invalid_argument("DistributedAttention: no local attention given");
  if (!group_) group_ = make_single_process_comm();
}

torch::Tensor DistributedAttention::forward(const torch::Tensor& query, const torch::Tensor& key,
                                            const torch::Tensor& value, int64_t batch_dim) const {
  if (batch_dim != 0 && batch_dim != 1) {
    throw std::invalid_argument("DistributedAttention: batch_dim is " + std::to_string(batch_dim) +
                                "; 0 ([batch, sequence, heads, head_dim]) or 1 ([sequence, batch, heads, head_dim])");
  }
  const int64_t parts = group_->world_size();
  for (const auto* t : {&query, &key, &value}) {
    if (t->dim() != 4) {
      throw std::invalid_argument("DistributedAttention: query, key and value must be 4-dimensional (heads at "
                                  "dimension 2); got " + c10::str(t->sizes()));
    }
    if (t->size(2) % parts != 0) {
      throw std::invalid_argument("DistributedAttention: " + std::to_string(t->size(2)) +
                                  " heads do not divide by the sequence-parallel size " + std::to_string(parts) +
                                  " (each rank attends over heads / size of them)");
    }
  }
  const int64_t sequence = batch_dim == 0 ? 1 : 0, heads = 2;
  auto to_heads = [&](const torch::Tensor& t) { return seq_all_to_all(t, group_, heads, sequence); };
  auto context = local_attention_(to_heads(query), to_heads(key), to_heads(value));
  return seq_all_to_all(context, group_, sequence, heads);
}

}  // namespace dscpp
