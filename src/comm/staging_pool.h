// StagingPool: reusable host buffers for the temporaries ProcessGroupComm's fallbacks reduce in.
// Without a native reduce-scatter (or bf16 arithmetic) a collective works on a copy of the caller's tensor. A fresh
// copy per call is a fresh allocation, and above glibc's mmap threshold (32 MiB, also under tune_host_malloc) each
// one is an mmap, a page fault per 4 KiB and an munmap: the Gloo reduce-scatter fallback fell from 0.45 to 0.11 GB/s
// algbw at 32 MB on 2 processes (bench/collectives). A buffer taken here goes back when its collective has been
// waited for, so a training loop's buckets cycle through the same few buffers.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <vector>

namespace dscpp {

class StagingPool {
 public:
  // A buffer of at least `numel` elements of `dtype` on `device`, as a flat tensor of exactly `numel`; its contents are
  // undefined. Give it back with give_back() once the collective that uses it has completed — never while a backend
  // may still read or write it. A buffer never given back is simply freed with its last reference.
  at::Tensor take(int64_t numel, torch::ScalarType dtype, const torch::Device& device);
  void give_back(const at::Tensor& buffer);

  int64_t free_bytes() const;  // held for reuse, not lent out

  // Free buffers kept at most, beyond which the smallest is dropped: one bucket reducing while the next fills
  // (overlap_comm). What is kept is host memory the model-state ledger does not count — up to twice the largest
  // fallback input (bench/memory: 9–19 MB above the ledger for `small` at N > 1 while this was 4).
  static constexpr size_t kMaxFree = 2;

 private:
  mutable std::mutex mutex_;
  std::vector<at::Tensor> free_;  // whole flat buffers
};

}  // namespace dscpp
