// StateStore: sub-group arithmetic, and the store that keeps everything resident.
#include "dscpp/offload/state_store.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace dscpp {

std::vector<int64_t> uniform_sub_groups(int64_t numel, int64_t sub_group_size) {
  if (numel < 0 || sub_group_size < 1) {
    throw std::invalid_argument("StateStore: numel " + std::to_string(numel) + " and sub_group_size " +
                                std::to_string(sub_group_size) + " must be >= 0 and >= 1");
  }
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < numel; at += sub_group_size) sizes.push_back(std::min(sub_group_size, numel - at));
  return sizes;
}

StateStore::StateStore(std::vector<int64_t> sub_group_sizes) : begins_{0} {
  for (int64_t n : sub_group_sizes) {
    if (n < 0) throw std::invalid_argument("StateStore: a sub-group of " + std::to_string(n) + " elements");
    begins_.push_back(begins_.back() + n);
    largest_ = std::max(largest_, n);
  }
}

int64_t StateStore::sub_group_numel(int i) const {
  if (i < 0 || i >= sub_groups()) {
    throw std::out_of_range("StateStore: sub-group " + std::to_string(i) + " of " + std::to_string(sub_groups()));
  }
  return begins_[static_cast<size_t>(i) + 1] - begins_[static_cast<size_t>(i)];
}

std::vector<StateStore::Piece> StateStore::pieces(int64_t offset, int64_t n) const {
  if (offset < 0 || n < 0 || offset + n > numel()) {
    throw std::out_of_range("StateStore: elements [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                            ") of " + std::to_string(numel()));
  }
  std::vector<Piece> out;
  for (int64_t at = 0; at < n;) {
    // The sub-group holding element offset + at: the last begin at or before it (skipping empty sub-groups).
    const int i = static_cast<int>(std::upper_bound(begins_.begin(), begins_.end() - 1, offset + at) -
                                   begins_.begin()) - 1;
    const int64_t within = offset + at - sub_group_begin(i);
    const int64_t count = std::min(n - at, sub_group_numel(i) - within);
    out.push_back({i, within, count, at});
    at += count;
  }
  return out;
}

void StateStore::read(int kind, int64_t offset, torch::Tensor out) {
  for (const auto& p : pieces(offset, out.numel())) {
    auto tensors = acquire(p.sub_group);
    out.narrow(0, p.at, p.count).copy_(tensors.at(static_cast<size_t>(kind)).narrow(0, p.within, p.count));
    release(p.sub_group, /*modified=*/false);
  }
}

void StateStore::write(const std::vector<Update>& updates) {
  std::map<int, std::vector<std::pair<const Update*, Piece>>> by_sub_group;
  for (const auto& u : updates) {
    for (const auto& p : pieces(u.offset, u.values.numel())) by_sub_group[p.sub_group].push_back({&u, p});
  }
  for (const auto& [i, parts] : by_sub_group) {
    auto tensors = acquire(i);
    for (const auto& [u, p] : parts) {
      tensors.at(static_cast<size_t>(u->kind)).narrow(0, p.within, p.count).copy_(u->values.narrow(0, p.at, p.count));
    }
    release(i);
  }
  flush();
}

namespace {

class ResidentStore final : public StateStore {
 public:
  ResidentStore(torch::Tensor master, std::vector<torch::Tensor> state, int64_t sub_group_size)
      : StateStore(uniform_sub_groups(master.numel(), sub_group_size)), tensors_{std::move(master)} {
    for (auto& t : state) {
      if (t.numel() != numel()) {
        throw std::invalid_argument("make_resident_store: a state tensor has " + std::to_string(t.numel()) +
                                    " elements, the master " + std::to_string(numel()));
      }
      tensors_.push_back(std::move(t));
    }
  }

  std::vector<torch::Tensor> acquire(int i) override {
    std::vector<torch::Tensor> out;
    for (const auto& t : tensors_) out.push_back(t.narrow(0, sub_group_begin(i), sub_group_numel(i)));
    return out;
  }

  void release(int, bool) override {}

 private:
  std::vector<torch::Tensor> tensors_;  // master, then each state kind
};

}  // namespace

std::unique_ptr<StateStore> make_resident_store(torch::Tensor master, std::vector<torch::Tensor> state,
                                                int64_t sub_group_size) {
  return std::make_unique<ResidentStore>(std::move(master), std::move(state), sub_group_size);
}

}  // namespace dscpp
