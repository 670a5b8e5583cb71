// GatheredGroup: gathering a ZeRO-3 group's buffer and freeing it again.
#include "dscpp/zero/gathered_group.h"

#include <stdexcept>

#include "dscpp/comm/quantized_all_gather.h"
#include "dscpp/compat/torch_compat.h"
#include "dscpp/zero/returnable_memory.h"

namespace dscpp {

GatheredGroup::GatheredGroup(std::string name, torch::Tensor buffer, torch::Tensor shard, State initial,
                             GatherWire wire)
    : name_(std::move(name)),
      buffer_(std::move(buffer)),
      shard_(std::move(shard)),
      numel_(buffer_.numel()),
      shard_numel_(shard_.numel()),
      element_size_(static_cast<int64_t>(buffer_.element_size())) {
  if (shard_.numel() == 0 || numel_ % shard_.numel() != 0) {
    throw std::invalid_argument("GatheredGroup '" + name_ + "': buffer of " + std::to_string(numel_) +
                                " elements is not a whole number of shards of " + std::to_string(shard_.numel()));
  }
  if (initial == State::kGathering) {
    throw std::invalid_argument("GatheredGroup '" + name_ + "': starts gathered or sharded, not gathering");
  }
  state_ = initial;
  wire_ = wire;
}

void GatheredGroup::start_gather(Comm& comm) {
  if (state_ != State::kSharded) return;
  allocate_returnable(buffer_, static_cast<size_t>(bytes()));
  if (secondary_valid_) {
    // hpZ: the parts this rank's group holds make up the whole buffer; nothing crosses the group.
    gather_input_ = secondary_;
    gather_ = secondary_comm_->all_gather(buffer_, gather_input_);
    state_ = State::kGathering;
    return;
  }
  if (stored_.values.defined()) {
    QuantizedBlocks sent{8, stored_.values.to(buffer_.device()), stored_.scales.to(buffer_.device())};
    gather_ = quantized_all_gather(comm, buffer_, sent, shard_numel_);
    state_ = State::kGathering;
    return;
  }
  if (store_ != nullptr) {
    // A copy, so the store's buffer is free again at once (stage 3 may have several gathers running).
    gather_input_ = store_->acquire(store_index_).front().to(buffer_.device(), /*non_blocking=*/false, /*copy=*/true);
    store_->release(store_index_, /*modified=*/false);
  } else {
    gather_input_ = shard_.device() == buffer_.device() ? shard_ : shard_.to(buffer_.device());
  }
  // The collective writes the storage directly; the parameters keep their own version counters (set_data does not
  // share them), so autograd's saved parameters stay valid across a release and re-gather.
  gather_ = wire_ == GatherWire::kInt8 ? quantized_all_gather(comm, buffer_, gather_input_)
                                       : comm.all_gather(buffer_, gather_input_);
  state_ = State::kGathering;
}

void GatheredGroup::store_quantized() {
  if (!shard_.defined()) {
    throw std::logic_error("GatheredGroup '" + name_ + "': only a shard held in memory can be stored quantized");
  }
  stored_ = quantize_blocks(shard_, 8);
  shard_ = torch::Tensor();
}

void GatheredGroup::read_shard(int64_t offset, torch::Tensor out) const {
  if (stored_.values.defined()) {
    out.copy_(dequantized(stored_).narrow(0, offset, out.numel()));
  } else if (shard_.defined()) {
    out.copy_(shard_.narrow(0, offset, out.numel()));
  } else {
    out.copy_(store_->acquire(store_index_).front().narrow(0, offset, out.numel()));
    store_->release(store_index_, /*modified=*/false);
  }
}

void GatheredGroup::write_shard(int64_t offset, const torch::Tensor& values) {
  torch::NoGradGuard no_grad;
  if (stored_.values.defined()) {
    auto shard = torch::empty({shard_numel_}, buffer_.options().device(stored_.values.device()));
    dequantize_blocks(stored_, shard);
    shard.narrow(0, offset, values.numel()).copy_(values.reshape({-1}));
    stored_ = quantize_blocks(shard, 8);
  } else if (shard_.defined()) {
    shard_.narrow(0, offset, values.numel()).copy_(values.reshape({-1}));
  } else {
    store_->acquire(store_index_).front().narrow(0, offset, values.numel()).copy_(values.reshape({-1}));
    store_->release(store_index_, /*modified=*/true);
  }
  drop_secondary();
}

int64_t GatheredGroup::shard_bytes() const {
  if (stored_.values.defined()) return stored_.values.nbytes() + stored_.scales.nbytes();
  if (store_ != nullptr) return 0;  // in the store's file, not in memory
  return shard_numel_ * element_size_;
}

void GatheredGroup::keep_shard_in(StateStore* store, int index) {
  if (store->sub_group_numel(index) != shard_numel_) {
    throw std::invalid_argument("GatheredGroup '" + name_ + "': the store's sub-group " + std::to_string(index) +
                                " is not this group's shard");
  }
  store_ = store;
  store_index_ = index;
  shard_ = torch::Tensor();
}

void GatheredGroup::wait_gathered(Comm& comm) {
  if (state_ == State::kSharded) start_gather(comm);
  if (state_ != State::kGathering) return;
  gather_.wait();  // throws (and stays failed) if the collective failed; the state stays kGathering then
  gather_ = Handle();
  gather_input_ = torch::Tensor();
  state_ = State::kGathered;
  if (secondary_comm_ && !secondary_valid_) {
    const int64_t part = numel_ / secondary_comm_->world_size();
    secondary_.copy_(buffer_.view({-1}).narrow(0, secondary_comm_->rank() * part, part));
    secondary_valid_ = true;
  }
  point_params();
}

void GatheredGroup::keep_secondary_over(std::shared_ptr<Comm> comm) {
  const int parts = comm->world_size();
  if (numel_ % parts != 0) {
    throw std::invalid_argument("GatheredGroup '" + name_ + "': " + std::to_string(numel_) + " elements do not split " +
                                "into " + std::to_string(parts) + " secondary shards");
  }
  secondary_ = torch::empty({numel_ / parts}, buffer_.options());
  secondary_comm_ = std::move(comm);
  secondary_valid_ = false;
}

void GatheredGroup::release() {
  if (state_ == State::kSharded) return;
  if (state_ == State::kGathering) {
    gather_.wait();
    gather_ = Handle();
    gather_input_ = torch::Tensor();
  }
  compat::release_storage(buffer_);
  state_ = State::kSharded;
  point_params();
}

void GatheredGroup::hold(std::vector<torch::Tensor> params, std::vector<torch::Tensor> views) {
  if (params.size() != views.size()) {
    throw std::invalid_argument("GatheredGroup '" + name_ + "': " + std::to_string(params.size()) +
                                " parameters but " + std::to_string(views.size()) + " views");
  }
  params_ = std::move(params);
  views_ = std::move(views);
  empty_ = torch::empty({0}, buffer_.options());
  point_params();
}

void GatheredGroup::point_params() {
  // set_data swaps only what the tensor points at: the same TensorImpl (autograd's saved parameter, its gradient
  // accumulator, the module's attribute) and its own version counter stay.
  torch::NoGradGuard no_grad;
  const bool gathered = state_ == State::kGathered;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_data(gathered ? views_[i] : empty_);
}

}  // namespace dscpp
