// Comm: the one interface every collective goes through (STYLE rule 6). Only src/comm/ talks to c10d.
// Collectives act on flat tensors and return a Handle, so a caller can overlap communication with compute and
// wait only where it needs the result.
#pragma once

#include <torch/torch.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/dist_env.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace dscpp {

enum class ReduceOp { kSum, kMax, kMin };

// A pending collective. wait() blocks until the result is in the output tensor. It is idempotent: after a failure
// (CommError naming the collective and the ranks involved, when a peer failed or the collective timed out) every
// later wait() throws the same error again rather than pretending the collective finished.
class Handle {
 public:
  Handle() = default;  // an already-completed handle
  explicit Handle(std::function<void()> wait) : wait_(std::move(wait)) {}
  void wait() {
    if (error_) std::rethrow_exception(error_);
    if (!wait_) return;
    auto w = std::move(wait_);
    wait_ = nullptr;
    try {
      w();
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
  }

 private:
  std::function<void()> wait_;
  std::exception_ptr error_;
};

class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Records of a few integers that ranks post to each other in order, over the rendezvous store on connections of
// the stream's own, so one thread can post without waiting while another reads (a store runs one operation at a
// time per connection, and a read waits for its key). Records go between rank 0 and every other rank: rank 0
// reads every rank's, the others read rank 0's, so each record has one reader, who deletes it.
class SideStream {
 public:
  virtual ~SideStream() = default;
  // The ranks whose records this rank reads, and who read this rank's.
  virtual const std::vector<int>& peers() const = 0;
  // This rank's record number `index` (0, 1, 2, … in order), to every peer. Returns once it is sent.
  virtual void post(int64_t index, const std::vector<int64_t>& values) = 0;
  // Peer `rank`'s record `index`, once it is posted (up to the store's timeout); throws CommError when the store
  // is lost.
  virtual std::vector<int64_t> read(int rank, int64_t index) = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "single", "gloo", "nccl"

  // In place over all ranks.
  virtual Handle all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // `input` is world_size equal chunks; rank r receives the reduction of chunk r in `output` (input.numel()/world).
  virtual Handle reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op = ReduceOp::kSum) = 0;
  // `output` (world_size × input.numel()) receives every rank's `input`, rank-major.
  virtual Handle all_gather(torch::Tensor& output, const torch::Tensor& input) = 0;
  virtual Handle broadcast(torch::Tensor& tensor, int root) = 0;
  // Expert parallelism's token exchange (MPI_Alltoall): `input` is world_size equal chunks, rank-major; chunk j goes
  // to rank j, and chunk j of `output` (as large as `input`) receives rank j's chunk for this rank.
  virtual Handle all_to_all(torch::Tensor& output, const torch::Tensor& input) = 0;
  virtual void barrier() = 0;

  // Point to point (pipeline parallelism): `tensor` to rank `peer` of this comm, and into `tensor` (its shape and
  // dtype agreed beforehand) from `peer`. A send pairs with the peer's recv of the same tag; sends from one rank to
  // another with one tag arrive in the order they were issued. The tensor must stay alive and unchanged (send) or
  // untouched (recv) until wait(). Not collective: only the two ranks take part. std::invalid_argument for a peer
  // outside the comm or this rank itself.
  virtual Handle send(const torch::Tensor& tensor, int peer, int tag = 0) = 0;
  virtual Handle recv(torch::Tensor& tensor, int peer, int tag = 0) = 0;

  // Every rank's `values` (the same count on each), rank-major, exchanged through the rendezvous store instead of
  // the process group: never queued behind collectives in flight, so a check can run while data moves. Blocking,
  // a few round trips to the store; for a handful of integers (ZeRO-3's order check), not for data. Every rank
  // calls it the same number of times.
  virtual std::vector<int64_t> side_all_gather(const std::vector<int64_t>& values) = 0;

  // A SideStream among these ranks, or null where there is no store to carry one (then callers exchange with
  // side_all_gather). Every rank opens its streams in the same order. Not collective: it only connects.
  virtual std::unique_ptr<SideStream> open_side_stream() { return nullptr; }

  // MPI_Comm_split: the ranks passing the same `color` (>= 0) form a new Comm, numbered by (`key`, rank here) —
  // how a rank grid gets its data-, model- and pipeline-parallel groups. Collective over this comm: every rank calls
  // it, in the same order as its other splits. The new comm runs over the same store, under keys of its own, with
  // this comm's backend and timeout; a group of one rank is the single-process comm.
  virtual std::shared_ptr<Comm> split(int color, int key) = 0;

  // Makes every wait() in progress on this comm's collectives, and every later one whose collective has not
  // finished, throw `error`: for a watcher thread that learns the ranks can no longer pair their collectives (the
  // ZeRO-3 order check), so a rank blocked in a collective its peers will never join stops with the reason
  // instead of a timeout. Where waits cannot be interrupted (NCCL's wait does not block the host), nothing.
  virtual void interrupt(std::exception_ptr /*error*/) {}
};

// One process, no peers: every collective is the identity (or a copy). Used when WORLD_SIZE is unset or 1.
std::shared_ptr<Comm> make_single_process_comm();

enum class CommBackend { kAuto, kGloo, kNccl };  // kAuto: NCCL for CUDA tensors where built, else Gloo

// Joins the job described by `env`: TCPStore rendezvous at master_addr:master_port (rank 0 hosts it), then a
// c10d process group. world_size 1 gives the single-process comm. Collectives time out after env.timeout with a
// CommError naming this rank and the collective.
std::shared_ptr<Comm> init_comm(const DistEnv& env, CommBackend backend = CommBackend::kAuto);

// The Comm over a process group someone else made — torch.distributed's default group, from the Python front end —
// so that the engine's collectives and the program's own run over one rendezvous. `backend` is the group's, "gloo"
// or "nccl". side_all_gather's keys go into `store` (the group's) under `key_prefix`, which must differ between the
// comms one job makes over the same store (every rank passing the same one), or a new comm would read an old one's
// keys. Collective (it probes the backend's features): every rank calls it at the same point.
std::shared_ptr<Comm> make_comm_over(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                     const c10::intrusive_ptr<c10d::Store>& store, const std::string& backend,
                                     const std::string& key_prefix);

}  // namespace dscpp
