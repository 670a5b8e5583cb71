// GatheredGroup: gathering a ZeRO-3 group's buffer and freeing it again.
#include "dscpp/zero/gathered_group.h"

#include <stdexcept>

#include "dscpp/compat/torch_compat.h"
#include "dscpp/zero/returnable_memory.h"

namespace dscpp {

GatheredGroup::GatheredGroup(std::string name, torch::Tensor buffer, torch::Tensor shard, State initial)
    : name_(std::move(name)), buffer_(std::move(buffer)), shard_(std::move(shard)), numel_(buffer_.numel()) {
  if (shard_.numel() == 0 || numel_ % shard_.numel() != 0) {
    throw std::invalid_argument("GatheredGroup '" + name_ + "': buffer of " + std::to_string(numel_) +
                                " elements is not a whole number of shards of " + std::to_string(shard_.numel()));
  }
  if (initial == State::kGathering) {
    throw std::invalid_argument("GatheredGroup '" + name_ + "': starts gathered or sharded, not gathering");
  }
  state_ = initial;
}

void GatheredGroup::start_gather(Comm& comm) {
  if (state_ != State::kSharded) return;
  allocate_returnable(buffer_, static_cast<size_t>(bytes()));
  // The collective writes the storage directly; the parameters keep their own version counters (set_data does not
  // share them), so autograd's saved parameters stay valid across a release and re-gather.
  gather_ = comm.all_gather(buffer_, shard_);
  state_ = State::kGathering;
}

void GatheredGroup::wait_gathered(Comm& comm) {
  if (state_ == State::kSharded) start_gather(comm);
  if (state_ != State::kGathering) return;
  gather_.wait();  // throws (and stays failed) if the collective failed; the state stays kGathering then
  gather_ = Handle();
  state_ = State::kGathered;
}

void GatheredGroup::release() {
  if (state_ == State::kSharded) return;
  if (state_ == State::kGathering) {
    gather_.wait();
    gather_ = Handle();
  }
  compat::release_storage(buffer_);
  state_ = State::kSharded;
}

}  // namespace dscpp
