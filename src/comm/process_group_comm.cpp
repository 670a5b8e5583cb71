// ProcessGroupComm: collectives over a c10d process group. Every collective is the backend's own (torch 2.11's Gloo
// reduces bf16 and has _reduce_scatter_base and _allgather_base; NCCL has all of them): this layer adds the checks,
// the Handles that can be interrupted, and errors that name the rank, the collective and the node lost.
#include "process_group_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <sstream>
#include <stdexcept>
#include <thread>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "comm_errors.h"
#include "dscpp/fault/kill_point.h"
#include "store_side_channel.h"

namespace dscpp {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  throw std::invalid_argument("unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

void check_dense(const char* op, const char* name, const torch::Tensor& t) {
  if (!t.defined()) throw std::invalid_argument(std::string(op) + ": `" + name + "` is an undefined tensor");
  if (!t.is_contiguous())
    throw std::invalid_argument(std::string(op) + ": `" + name + "` must be contiguous (a flat buffer)");
}

void check_same_dtype(const char* op, const torch::Tensor& output, const torch::Tensor& input) {
  if (output.scalar_type() != input.scalar_type())
    throw std::invalid_argument(std::string(op) + ": output is " + dtype_name(output.scalar_type()) +
                                " but input is " + dtype_name(input.scalar_type()) + "; they must match");
}

}  // namespace

ProcessGroupComm::ProcessGroupComm(c10::intrusive_ptr<c10d::Backend> group, c10::intrusive_ptr<c10d::Store> store,
                                   CommBackend backend, int rank, int world_size, std::string stream_prefix,
                                   GroupFactory make_group)
    : group_(std::move(group)),
      store_(std::move(store)),
      backend_(backend),
      rank_(rank),
      world_size_(world_size),
      stream_prefix_(std::move(stream_prefix)),
      make_group_(std::move(make_group)) {}

ProcessGroupComm::~ProcessGroupComm() = default;

std::string ProcessGroupComm::prefix() const {
  return "rank " + std::to_string(rank_) + "/" + std::to_string(world_size_) + ": ";
}

std::vector<int64_t> ProcessGroupComm::side_all_gather(const std::vector<int64_t>& values) {
  return store_all_gather(*store_, side_calls_++, rank_, world_size_, values, prefix());
}

void ProcessGroupComm::set_nodes(std::vector<JobNode> nodes, int mine) {
  nodes_ = std::make_shared<const std::vector<JobNode>>(std::move(nodes));
  my_node_ = mine;
}

Handle ProcessGroupComm::launch(const std::string& what, const Issue& issue) {
  fault::kill_point("comm.collective");
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = issue();
  } catch (const std::exception& e) {
    throw CommError(prefix() + what + " could not start: " + reason(e));
  }
  std::string context = prefix() + what;
  // Gloo's wait blocks this thread until the peers take part, so it waits on the Work's future instead, which
  // interrupt() can cut short. (NCCL's wait only orders streams: nothing to interrupt.)
  c10::intrusive_ptr<c10::ivalue::Future> future;
  if (backend_ == CommBackend::kGloo) {
    try {
      future = work->getFuture();
    } catch (const std::exception&) {
      future.reset();  // a Work without a future: a plain, uninterruptible wait
    }
  }
  if (future) {
    future->addCallback([interrupt = interrupt_](c10::ivalue::Future&) {
      std::lock_guard<std::mutex> lock(interrupt->mutex);
      interrupt->changed.notify_all();
    });
  }
  return Handle([work, future, interrupt = interrupt_, context, nodes = nodes_,
                 mine = my_node_] {
    if (future) {
      std::unique_lock<std::mutex> lock(interrupt->mutex);
      interrupt->changed.wait(lock, [&] { return future->completed() || interrupt->error; });
      if (!future->completed()) std::rethrow_exception(interrupt->error);
    }
    try {
      work->wait();
    } catch (const std::exception& e) {
      const std::string why = reason(e);
      throw CommError(context + " failed: " + why + blame(why, nodes.get(), mine));
    }
  });
}

void ProcessGroupComm::interrupt(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(interrupt_->mutex);
  if (!interrupt_->error) interrupt_->error = std::move(error);
  interrupt_->changed.notify_all();
}

// Every rank's (color, key) through the store; then each group connects a process group of its own under
// "<stream prefix>split<k>/<color>" (torch's new_group does the same with a PrefixStore per group), so groups of one
// split, and of successive splits, never read each other's keys.
std::shared_ptr<Comm> ProcessGroupComm::split(int color, int key) {
  if (color < 0) throw std::invalid_argument("split: color must be >= 0, got " + std::to_string(color));
  const int64_t index = splits_++;
  const auto all = side_all_gather({color, key});
  std::vector<std::pair<int64_t, int>> members;  // (key, rank here) of the ranks of this color
  for (int r = 0; r < world_size_; ++r) {
    if (all[2 * r] == color) members.push_back({all[2 * r + 1], r});
  }
  std::sort(members.begin(), members.end());
  const int size = static_cast<int>(members.size());
  int rank = 0;  // this rank's place in its group
  while (members[rank].second != rank_) ++rank;
  if (size == 1) return make_single_process_comm();
  if (!make_group_) throw CommError(prefix() + "split: this comm cannot make sub-groups");
  const std::string name = stream_prefix_ + "split" + std::to_string(index) + "/" + std::to_string(color);
  auto store = c10::make_intrusive<c10d::PrefixStore>(name, store_);
  const std::string me = prefix() + "split #" + std::to_string(index) + " (color " + std::to_string(color) + ", " +
                         std::to_string(size) + " ranks): ";
  c10::intrusive_ptr<c10d::Backend> group;
  try {
    group = make_group_(store, rank, size);
  } catch (const std::exception& e) {
    throw CommError(me + "connecting the group failed: " + reason(e) + ". A peer rank probably died; see its log.");
  }
  return std::make_shared<ProcessGroupComm>(group, store, backend_, rank, size, name + "/", make_group_);
}

std::unique_ptr<SideStream> ProcessGroupComm::open_side_stream() {
  const auto* server = tcp_store_under(store_.get());
  if (server == nullptr || world_size_ == 1) return nullptr;
  const std::string name = "dscpp/" + stream_prefix_ + "stream/" + std::to_string(streams_++);
  return make_store_side_stream(*server, store_->getTimeout(), name, rank_, world_size_);
}

Handle ProcessGroupComm::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  check_dense("all_reduce", "tensor", tensor);
  if (tensor.numel() == 0 || world_size_ == 1) return {};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  std::vector<at::Tensor> tensors{tensor};
  return launch(describe_op("all_reduce", tensor), [&] { return group_->allreduce(tensors, options); });
}

Handle ProcessGroupComm::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  check_dense("reduce_scatter", "output", output);
  check_dense("reduce_scatter", "input", input);
  check_same_dtype("reduce_scatter", output, input);
  const int64_t n = output.numel();
  if (input.numel() != n * world_size_)
    throw std::invalid_argument("reduce_scatter: input has " + std::to_string(input.numel()) +
                                " elements; it must be world_size (" + std::to_string(world_size_) +
                                ") x output (" + std::to_string(n) + ")");
  if (n == 0) return {};
  if (world_size_ == 1) {
    output.copy_(input.view_as(output));
    return {};
  }
  c10d::ReduceScatterOptions options;
  options.reduceOp = to_c10d(op);
  at::Tensor out = output.view({-1});
  at::Tensor in = input.view({-1});
  return launch(describe_op("reduce_scatter", input), [&] { return group_->_reduce_scatter_base(out, in, options); });
}

Handle ProcessGroupComm::all_gather(torch::Tensor& output, const torch::Tensor& input) {
  check_dense("all_gather", "output", output);
  check_dense("all_gather", "input", input);
  check_same_dtype("all_gather", output, input);
  const int64_t n = input.numel();
  if (output.numel() != n * world_size_)
    throw std::invalid_argument("all_gather: output has " + std::to_string(output.numel()) +
                                " elements; it must be world_size (" + std::to_string(world_size_) +
                                ") x input (" + std::to_string(n) + ")");
  if (n == 0) return {};
  if (world_size_ == 1) {
    if (!output.is_same(input)) output.copy_(input.view_as(output));
    return {};
  }
  at::Tensor in = input.view({-1});
  at::Tensor out = output.view({-1});
  return launch(describe_op("all_gather", input), [&] { return group_->_allgather_base(out, in); });
}

Handle ProcessGroupComm::all_to_all(torch::Tensor& output, const torch::Tensor& input) {
  check_dense("all_to_all", "output", output);
  check_dense("all_to_all", "input", input);
  check_same_dtype("all_to_all", output, input);
  const int64_t n = input.numel();
  if (output.numel() != n || n % world_size_ != 0)
    throw std::invalid_argument("all_to_all: input has " + std::to_string(n) + " elements and output " +
                                std::to_string(output.numel()) + "; both must be the same multiple of world_size (" +
                                std::to_string(world_size_) + ")");
  if (n == 0) return {};
  if (world_size_ == 1) {
    if (!output.is_same(input)) output.copy_(input.view_as(output));
    return {};
  }
  // Empty split lists mean equal chunks.
  at::Tensor in = input.view({-1});
  at::Tensor out = output.view({-1});
  std::vector<int64_t> equal;
  return launch(describe_op("all_to_all", input), [&] { return group_->alltoall_base(out, in, equal, equal); });
}

void ProcessGroupComm::check_peer(const char* op, int peer) const {
  if (peer < 0 || peer >= world_size_ || peer == rank_) {
    throw std::invalid_argument(std::string(op) + ": peer " + std::to_string(peer) + " is not another rank in 0.." +
                                std::to_string(world_size_ - 1) + " (this rank is " + std::to_string(rank_) + ")");
  }
}

Handle ProcessGroupComm::point_to_point(bool sending, const torch::Tensor& tensor, int peer, int tag) {
  const char* op = sending ? "send" : "recv";
  check_dense(op, "tensor", tensor);
  check_peer(op, peer);
  if (tensor.numel() == 0) return {};
  std::vector<at::Tensor> tensors{tensor};
  return launch(describe_op(op, tensor) + (sending ? " to rank " : " from rank ") + std::to_string(peer), [&] {
    return sending ? group_->send(tensors, peer, tag) : group_->recv(tensors, peer, tag);
  });
}

Handle ProcessGroupComm::send(const torch::Tensor& tensor, int peer, int tag) {
  return point_to_point(/*sending=*/true, tensor, peer, tag);
}

Handle ProcessGroupComm::recv(torch::Tensor& tensor, int peer, int tag) {
  return point_to_point(/*sending=*/false, tensor, peer, tag);
}

Handle ProcessGroupComm::broadcast(torch::Tensor& tensor, int root) {
  check_dense("broadcast", "tensor", tensor);
  if (root < 0 || root >= world_size_)
    throw std::invalid_argument("broadcast: root=" + std::to_string(root) + " is not a rank in 0.." +
                                std::to_string(world_size_ - 1));
  if (tensor.numel() == 0 || world_size_ == 1) return {};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.rootTensor = 0;
  std::vector<at::Tensor> tensors{tensor};
  return launch(describe_op("broadcast", tensor), [&] { return group_->broadcast(tensors, options); });
}

// A one-element all_reduce, not c10d's barrier: Gloo's barrier also waits on every earlier Work still held by its
// worker threads and rethrows their errors, so any Work whose Handle already threw could fail a later, healthy
// barrier.
void ProcessGroupComm::barrier() {
  if (world_size_ == 1) return;
  // NCCL reduces CUDA tensors only: there the token lives on this rank's current GPU (the engine made it current).
  auto options = torch::TensorOptions().dtype(torch::kInt);
  if (backend_ == CommBackend::kNccl) options = options.device(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice());
  std::vector<at::Tensor> token{torch::zeros({1}, options)};
  launch("barrier", [&] { return group_->allreduce(token); }).wait();
}

}  // namespace dscpp
