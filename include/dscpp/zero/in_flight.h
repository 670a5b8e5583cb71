// InFlight: collectives started but not yet waited for, oldest first, with the tensors they read or write kept alive
// until they finish. Bounding how many run at once bounds the memory their buffers take; waiting in order keeps
// every rank's sequence of waits identical.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <utility>
#include <vector>

#include "dscpp/comm/comm.h"

namespace dscpp {

class InFlight {
 public:
  // At most `limit` collectives stay running after push(); 0 means wait for each one at once.
  explicit InFlight(size_t limit) : limit_(limit) {}

  void push(Handle handle, std::vector<torch::Tensor> keep_alive = {}) {
    pending_.push_back({std::move(handle), std::move(keep_alive)});
    drain(limit_);
  }

  // Waits for the oldest until at most `keep` are still running.
  void drain(size_t keep = 0) {
    while (pending_.size() > keep) {
      auto front = std::move(pending_.front());
      pending_.pop_front();
      front.handle.wait();
    }
  }

  size_t size() const { return pending_.size(); }
  size_t limit() const { return limit_; }

 private:
  struct Entry {
    Handle handle;
    std::vector<torch::Tensor> keep_alive;
  };
  size_t limit_;
  std::deque<Entry> pending_;
};

}  // namespace dscpp
