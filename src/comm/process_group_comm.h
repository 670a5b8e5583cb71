// ProcessGroupComm: the Comm over a c10d process group (Gloo on CPU, NCCL on GPU). It turns c10d Works into
// Handles, and c10d/Gloo exceptions into CommErrors that name the rank and the collective.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "c10d_headers.h"
#include "comm_errors.h"
#include "dscpp/comm/comm.h"

namespace dscpp {

// Makes a process group of `size` ranks over `store`, this one `rank` of them, with the backend and settings of the
// comm that holds the factory (Gloo's devices and timeout, NCCL's options): split()'s sub-groups.
using GroupFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)>;

class ProcessGroupComm final : public Comm {
 public:
  // `store` is kept alive as long as the group (rank 0 hosts it).
  // `stream_prefix` names this comm's side streams and sub-groups in the store (make_comm_over's key_prefix): comms
  // over one store must use different ones. `make_group` makes split()'s groups.
  ProcessGroupComm(c10::intrusive_ptr<c10d::Backend> group, c10::intrusive_ptr<c10d::Store> store,
                   CommBackend backend, int rank, int world_size, std::string stream_prefix, GroupFactory make_group);
  // Drops the group: c10d drains queued collectives and joins its threads, each ending within the timeout (a
  // dead peer fails fast). Handles not waited for complete in c10d but skip their copy-out: callers must wait().
  ~ProcessGroupComm() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return backend_ == CommBackend::kNccl ? "nccl" : "gloo"; }

  Handle all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  Handle reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op = ReduceOp::kSum) override;
  Handle all_gather(torch::Tensor& output, const torch::Tensor& input) override;
  Handle broadcast(torch::Tensor& tensor, int root) override;
  Handle all_to_all(torch::Tensor& output, const torch::Tensor& input) override;
  void barrier() override;
  Handle send(const torch::Tensor& tensor, int peer, int tag = 0) override;
  Handle recv(torch::Tensor& tensor, int peer, int tag = 0) override;
  std::vector<int64_t> side_all_gather(const std::vector<int64_t>& values) override;
  // Over two connections of its own to the TCPStore under `store` (none when it is not a TCPStore).
  std::unique_ptr<SideStream> open_side_stream() override;
  // A job on several hosts: its nodes, this rank's being `mine`. A failed collective's error then names the node it
  // lost — the one whose address the backend's error holds, else the other nodes — instead of "a peer".
  void set_nodes(std::vector<JobNode> nodes, int mine);
  void interrupt(std::exception_ptr error) override;
  std::shared_ptr<Comm> split(int color, int key) override;

 private:
  // What interrupt() raises, shared with the waits of collectives still pending when the comm is gone.
  struct Interrupt {
    std::mutex mutex;
    std::condition_variable changed;  // a collective finished, or the error was set
    std::exception_ptr error;
  };
  using Issue = std::function<c10::intrusive_ptr<c10d::Work>()>;
  // Starts a collective (`issue`) and returns a Handle whose wait() waits on the Work. `what` is e.g. "all_reduce of
  // 7 x float32", used in error messages.
  Handle launch(const std::string& what, const Issue& issue);
  std::string prefix() const;
  void check_peer(const char* op, int peer) const;
  Handle point_to_point(bool sending, const torch::Tensor& tensor, int peer, int tag);  // send and recv

  c10::intrusive_ptr<c10d::Backend> group_;
  c10::intrusive_ptr<c10d::Store> store_;
  CommBackend backend_;  // kGloo or kNccl
  int rank_;
  int world_size_;
  int64_t side_calls_ = 0;  // side_all_gather calls so far: names its store keys
  std::string stream_prefix_;
  int64_t streams_ = 0;  // side streams opened so far: names their keys
  int64_t splits_ = 0;   // split() calls so far: names their groups' keys
  GroupFactory make_group_;
  std::shared_ptr<Interrupt> interrupt_ = std::make_shared<Interrupt>();
  std::shared_ptr<const std::vector<JobNode>> nodes_;  // set_nodes; shared with pending Handles' error paths
  int my_node_ = 0;
};

}  // namespace dscpp
