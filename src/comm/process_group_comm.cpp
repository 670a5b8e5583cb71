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

#include "dscpp/fault/kill_point.h"

namespace dscpp {
namespace {

std::string dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    case torch::kLong: return "int64";
    case torch::kInt: return "int32";
    case torch::kShort: return "int16";
    case torch::kChar: return "int8";
    case torch::kByte: return "uint8";
    case torch::kBool: return "bool";
    default: return c10::toString(t);
  }
}

std::string describe(const char* op, const torch::Tensor& t) {
  return std::string(op) + " of " + std::to_string(t.numel()) + " x " + dtype_name(t.scalar_type());
}

// The exception's message without c10's backtrace or a trailing period (we append our own sentence).
std::string reason(const std::exception& e) {
  auto c10 = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10 ? c10->what_without_backtrace() : e.what();
  while (!text.empty() && (text.back() == '.' || text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// Integers as a store value and back (side_all_gather and side streams).
std::vector<uint8_t> to_bytes(const std::vector<int64_t>& values) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
  return std::vector<uint8_t>(bytes, bytes + values.size() * sizeof(int64_t));
}

std::vector<int64_t> from_bytes(const std::vector<uint8_t>& bytes) {
  std::vector<int64_t> values(bytes.size() / sizeof(int64_t));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(int64_t));
  return values;
}

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
                                   std::string backend, int rank, int world_size, std::string stream_prefix,
                                   GroupFactory make_group)
    : group_(std::move(group)),
      store_(std::move(store)),
      backend_(std::move(backend)),
      rank_(rank),
      world_size_(world_size),
      stream_prefix_(std::move(stream_prefix)),
      make_group_(std::move(make_group)) {}

ProcessGroupComm::~ProcessGroupComm() = default;

std::string ProcessGroupComm::prefix() const {
  return "rank " + std::to_string(rank_) + "/" + std::to_string(world_size_) + ": ";
}

// Keys "dscpp/side/<call mod 4>/<rank>". A rank deletes its own key of call k-2 during call k, so the store holds at
// most a few calls' keys. That is safe: any rank r read our key of call k-2 during its call k-2, before it set its key
// of call k-1; and we finished call k-1 only after reading r's key of call k-1. The names are reused mod 4, because
// a TCPStore may keep memory for every key name it has seen, deleted or not (measured on torch 1.13's: about 125
// bytes a name; 20,000 distinct keys grew the store's process by 2.5 MB, 8 reused names not at all). Reuse is safe: call k's name last
// named call k-4's key, which its rank deleted at the end of its call k-2 — before it set its key of call k-1, which
// any reader of call k has read.
std::vector<int64_t> ProcessGroupComm::side_all_gather(const std::vector<int64_t>& values) {
  const int64_t call = side_calls_++;
  auto key = [](int64_t c, int r) { return "dscpp/side/" + std::to_string(c % 4) + "/" + std::to_string(r); };
  std::vector<int64_t> all(values.size() * static_cast<size_t>(world_size_));
  try {
    store_->set(key(call, rank_), to_bytes(values));
    std::copy(values.begin(), values.end(), all.begin() + static_cast<std::ptrdiff_t>(rank_ * values.size()));
    for (int r = 0; r < world_size_; ++r) {
      // Our own values need no round trip through the store (one get in three fewer for two ranks).
      if (r == rank_) continue;
      const auto got = from_bytes(store_->get(key(call, r)));  // waits for rank r, up to the store's timeout
      if (got.size() != values.size()) {
        throw CommError(prefix() + "side_all_gather #" + std::to_string(call) + ": rank " + std::to_string(r) +
                        " sent " + std::to_string(got.size()) + " values, this rank " + std::to_string(values.size()));
      }
      std::copy(got.begin(), got.end(), all.begin() + static_cast<std::ptrdiff_t>(r * values.size()));
    }
    if (call >= 2) store_->deleteKey(key(call - 2, rank_));
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(prefix() + "side_all_gather #" + std::to_string(call) + " through the store failed: " + reason(e) +
                    ". A peer rank probably died or is stuck; see its log.");
  }
  return all;
}

namespace {

std::string node_name(const JobNode& node) {
  return "node " + std::to_string(node.index) + " (host " + node.host + ", " + node.address + "; rank" +
         (node.first_rank == node.last_rank ? " " + std::to_string(node.first_rank)
                                            : "s " + std::to_string(node.first_rank) + "-" +
                                                  std::to_string(node.last_rank)) +
         ")";
}

// The end of a failed collective's error: who was probably lost. Gloo names the peer's address when a connection
// breaks ("[10.0.0.2]:4123"), not when a wait times out; then every other node is a suspect.
std::string blame(const std::string& error, const std::vector<JobNode>* nodes, int mine) {
  if (nodes == nullptr) return ". A peer rank probably died or is stuck; see its log.";
  for (const auto& node : *nodes) {
    if (node.index != mine && error.find("[" + node.address + "]") != std::string::npos)
      return ". Lost " + node_name(node) + ": its ranks died or its host went away; see its log.";
  }
  std::string others;
  for (const auto& node : *nodes)
    if (node.index != mine) others += (others.empty() ? "" : ", ") + node_name(node);
  return ". A rank on another host probably died, or a host's network went away; the job's other hosts: " + others +
         ".";
}

}  // namespace

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
  if (backend_ == "gloo") {
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

c10d::TCPStore* tcp_store_under(c10d::Store* store) {
  while (store != nullptr) {
    if (auto* tcp = dynamic_cast<c10d::TCPStore*>(store)) return tcp;
    auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store);
    if (prefixed == nullptr) return nullptr;
    store = prefixed->getUnderlyingStore().get();
  }
  return nullptr;
}

namespace {

// Keys "<name>/<index mod kSlots>/<from>/<to>": one copy of a record per reader, deleted by it once read.
class StoreSideStream final : public SideStream {
 public:
  StoreSideStream(const c10d::TCPStore& server, std::chrono::milliseconds timeout, std::string name, int rank,
                  int world_size)
      : name_(std::move(name)), rank_(rank), timeout_(timeout) {
    if (rank == 0) {
      for (int r = 1; r < world_size; ++r) peers_.push_back(r);
    } else {
      peers_.push_back(0);
    }
    free_below_.assign(peers_.size(), kSlots);
    c10d::TCPStoreOptions options;
    options.port = server.getPort();
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = timeout;
    try {
      poster_ = c10::make_intrusive<c10d::TCPStore>(server.getHost(), options);
      reader_ = c10::make_intrusive<c10d::TCPStore>(server.getHost(), options);
    } catch (const std::exception& e) {
      throw CommError(where() + "could not connect to the rendezvous store: " + reason(e));
    }
  }

  const std::vector<int>& peers() const override { return peers_; }

  void post(int64_t index, const std::vector<int64_t>& values) override {
    const auto value = to_bytes(values);
    try {
      for (size_t p = 0; p < peers_.size(); ++p) {
        if (index >= free_below_[p]) free_below_[p] = wait_until_read(index - kSlots / 2, peers_[p]);
        poster_->set(key(index, rank_, peers_[p]), value);
      }
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(where() + "posting record " + std::to_string(index) + " failed: " + reason(e) +
                      ". A peer rank probably died; see its log.");
    }
  }

  std::vector<int64_t> read(int rank, int64_t index) override {
    const std::string k = key(index, rank, rank_);
    std::vector<uint8_t> got;
    try {
      got = reader_->get(k);
      reader_->deleteKey(k);
    } catch (const std::exception& e) {
      throw CommError(where() + "reading rank " + std::to_string(rank) + "'s record " + std::to_string(index) +
                      " failed: " + reason(e) + ". A peer rank probably died; see its log.");
    }
    return from_bytes(got);
  }

 private:
  // Record i's key is named by i mod kSlots: a TCPStore may keep memory for every key name it has seen, deleted or
  // not (torch 1.13's kept about 125 bytes a name), and ZeRO-3's order check posts a record per gather — unique names
  // grew rank 0 (the store's host) by 2.8 KB a step there (bench/soak). A name is reused only once its reader has deleted the record before.
  static constexpr int64_t kSlots = 1024;
  std::string key(int64_t index, int from, int to) const {
    return name_ + "/" + std::to_string(index % kSlots) + "/" + std::to_string(from) + "/" + std::to_string(to);
  }
  // Waits until `peer` has read (and so deleted) record `record`, and returns the first index whose name may still
  // hold an unread record. The peer reads in order, so every record up to `record` is gone too and the names of
  // records up to record + kSlots - 1 are free: asked every kSlots / 2 records, this costs the posting thread one
  // store round trip per 512 records, not one per record. Only this rank writes the name and only the peer deletes
  // it, and no later record has been posted under it, so "absent" means "read". Ranks meet in a collective every few
  // records, so the peer is never kSlots / 2 behind in practice and this returns at once; the poll covers the case
  // that cannot be ruled out, bounded by the store's timeout.
  int64_t wait_until_read(int64_t record, int peer) {
    const std::string k = key(record, rank_, peer);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (auto pause = std::chrono::microseconds(50); poster_->check({k});
         pause = std::min(pause * 2, std::chrono::microseconds(20'000))) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw CommError(where() + "rank " + std::to_string(peer) + " has not read record " + std::to_string(record) +
                        " within the store's timeout; it probably died or is stuck");
      }
      std::this_thread::sleep_for(pause);
    }
    return record + kSlots;
  }
  std::string where() const { return "rank " + std::to_string(rank_) + ": side stream " + name_ + ": "; }

  std::string name_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::vector<int> peers_;
  std::vector<int64_t> free_below_;  // per peer: records below this index may be posted without asking (see above)
  c10::intrusive_ptr<c10d::TCPStore> poster_;  // used by the posting thread only
  c10::intrusive_ptr<c10d::TCPStore> reader_;  // used by the reading thread only
};

}  // namespace

std::unique_ptr<SideStream> ProcessGroupComm::open_side_stream() {
  const auto* server = tcp_store_under(store_.get());
  if (server == nullptr || world_size_ == 1) return nullptr;
  const std::string name = "dscpp/" + stream_prefix_ + "stream/" + std::to_string(streams_++);
  return std::make_unique<StoreSideStream>(*server, store_->getTimeout(), name, rank_, world_size_);
}

Handle ProcessGroupComm::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  check_dense("all_reduce", "tensor", tensor);
  if (tensor.numel() == 0 || world_size_ == 1) return {};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  std::vector<at::Tensor> tensors{tensor};
  return launch(describe("all_reduce", tensor), [&] { return group_->allreduce(tensors, options); });
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
  return launch(describe("reduce_scatter", input), [&] { return group_->_reduce_scatter_base(out, in, options); });
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
  return launch(describe("all_gather", input), [&] { return group_->_allgather_base(out, in); });
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
  return launch(describe("all_to_all", input), [&] { return group_->alltoall_base(out, in, equal, equal); });
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
  return launch(describe(op, tensor) + (sending ? " to rank " : " from rank ") + std::to_string(peer), [&] {
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
  return launch(describe("broadcast", tensor), [&] { return group_->broadcast(tensors, options); });
}

// A one-element all_reduce, not c10d's barrier: Gloo's barrier also waits on every earlier Work still held by its
// worker threads and rethrows their errors, so any Work whose Handle already threw could fail a later, healthy
// barrier.
void ProcessGroupComm::barrier() {
  if (world_size_ == 1) return;
  // NCCL reduces CUDA tensors only: there the token lives on this rank's current GPU (the engine made it current).
  auto options = torch::TensorOptions().dtype(torch::kInt);
  if (backend_ == "nccl") options = options.device(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice());
  std::vector<at::Tensor> token{torch::zeros({1}, options)};
  launch("barrier", [&] { return group_->allreduce(token); }).wait();
}

}  // namespace dscpp
