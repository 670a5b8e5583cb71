// The rank side of comm_process_test: run as `comm_process_test --worker SCENARIO` with RANK/WORLD_SIZE/MASTER_*
// set. Every rank builds the same deterministic per-rank inputs, so each can compute every expected result itself.
// Inputs are small integers, exact in every dtype (fp16/bf16 included) for sums over up to 4 ranks.
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include "comm_worker.h"
#include "dscpp/comm/comm.h"
#include "dscpp/comm/topology.h"

namespace dscpp::testing {
namespace {

struct Mismatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Rank r's input: integers in -8..8, different on each rank and position.
torch::Tensor input_of(int rank, int64_t n, torch::ScalarType dtype, int64_t salt = 0) {
  auto i = torch::arange(n, torch::kLong);
  return ((i * 7 + rank * 13 + salt) % 17 - 8).to(dtype);
}

torch::Tensor reference(int world, int64_t n, torch::ScalarType dtype, ReduceOp op, int64_t salt = 0) {
  auto acc = input_of(0, n, torch::kLong, salt);
  for (int r = 1; r < world; ++r) {
    auto x = input_of(r, n, torch::kLong, salt);
    acc = op == ReduceOp::kSum ? acc + x : op == ReduceOp::kMax ? torch::maximum(acc, x) : torch::minimum(acc, x);
  }
  return acc.to(dtype);
}

void expect_equal(const std::string& what, const torch::Tensor& got, const torch::Tensor& want) {
  if (got.scalar_type() != want.scalar_type() || got.numel() != want.numel())
    throw Mismatch(what + ": got " + std::to_string(got.numel()) + " elements of " + c10::toString(got.scalar_type()));
  if (got.numel() == 0 || torch::equal(got.reshape({-1}), want.reshape({-1}))) return;
  auto diff = (got.reshape({-1}).to(torch::kDouble) != want.reshape({-1}).to(torch::kDouble)).nonzero();
  const int64_t at = diff.numel() ? diff[0][0].item<int64_t>() : -1;
  std::ostringstream msg;
  msg << what << ": mismatch at index " << at << ": got " << got.reshape({-1})[at].item<double>() << ", expected "
      << want.reshape({-1})[at].item<double>();
  throw Mismatch(msg.str());
}

std::vector<int> all_but_zero(int world) {
  std::vector<int> out;
  for (int r = 1; r < world; ++r) out.push_back(r);
  return out;
}

const char* op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : op == ReduceOp::kMax ? "max" : "min"; }

std::string label(const char* coll, torch::ScalarType dtype, int64_t n, const char* extra = "") {
  return std::string(coll) + " " + c10::toString(dtype) + " n=" + std::to_string(n) + " " + extra;
}

void check_all(Comm& comm) {
  const int rank = comm.rank(), world = comm.world_size();
  const std::vector<torch::ScalarType> dtypes{torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble,
                                              torch::kLong};
  const std::vector<ReduceOp> ops{ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
  const std::vector<int64_t> sizes{0, 1, 7, 1000003};  // 7 and 1000003 divide by none of 2, 3, 4
  for (auto dtype : dtypes) {
    for (int64_t n : sizes) {
      for (auto op : ops) {
        auto t = input_of(rank, n, dtype);
        comm.all_reduce(t, op).wait();
        expect_equal(label("all_reduce", dtype, n, op_name(op)), t, reference(world, n, dtype, op));

        const int64_t chunk = n == 1000003 ? 250001 : n;  // reduce_scatter's per-rank share
        auto in = input_of(rank, chunk * world, dtype);
        auto out = torch::full({chunk}, -99, dtype);
        comm.reduce_scatter(out, in, op).wait();
        auto want = reference(world, chunk * world, dtype, op).narrow(0, rank * chunk, chunk);
        expect_equal(label("reduce_scatter", dtype, chunk, op_name(op)), out, want);
        expect_equal("reduce_scatter leaves its input alone", in, input_of(rank, chunk * world, dtype));
      }
      const int64_t share = n == 1000003 ? 250001 : n;
      auto mine = input_of(rank, share, dtype);
      auto all = torch::full({share * world}, -99, dtype);
      comm.all_gather(all, mine).wait();
      std::vector<torch::Tensor> parts;
      for (int r = 0; r < world; ++r) parts.push_back(input_of(r, share, dtype));
      expect_equal(label("all_gather", dtype, share), all, torch::cat(parts));

      for (int root = (n > 1000 ? world - 1 : 0); root < world; ++root) {
        auto b = input_of(rank, n, dtype);
        comm.broadcast(b, root).wait();
        expect_equal(label("broadcast", dtype, n, ("root " + std::to_string(root)).c_str()), b,
                     input_of(root, n, dtype));
      }
    }
  }
}

// Several collectives in flight at once, waited for in reverse order of issue.
void check_overlap(Comm& comm) {
  const int rank = comm.rank(), world = comm.world_size();
  const int64_t n = 4099;
  std::vector<torch::Tensor> sums;
  std::vector<Handle> handles;
  for (int k = 0; k < 4; ++k) {
    sums.push_back(input_of(rank, n, k % 2 ? torch::kBFloat16 : torch::kFloat, k));
    handles.push_back(comm.all_reduce(sums.back(), ReduceOp::kSum));
  }
  auto rs_in = input_of(rank, 5 * world, torch::kBFloat16, 3);
  auto rs_out = torch::zeros({5}, torch::kBFloat16);
  handles.push_back(comm.reduce_scatter(rs_out, rs_in, ReduceOp::kMax));
  auto ag_in = input_of(rank, 3, torch::kFloat, 5);
  auto ag_out = torch::zeros({3 * world}, torch::kFloat);
  handles.push_back(comm.all_gather(ag_out, ag_in));
  for (auto it = handles.rbegin(); it != handles.rend(); ++it) it->wait();
  for (auto& h : handles) h.wait();  // idempotent
  for (int k = 0; k < 4; ++k)
    expect_equal("overlapped all_reduce " + std::to_string(k), sums[k],
                 reference(world, n, sums[k].scalar_type(), ReduceOp::kSum, k));
  expect_equal("overlapped reduce_scatter", rs_out,
               reference(world, 5 * world, torch::kBFloat16, ReduceOp::kMax, 3).narrow(0, rank * 5, 5));
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < world; ++r) parts.push_back(input_of(r, 3, torch::kFloat, 5));
  expect_equal("overlapped all_gather", ag_out, torch::cat(parts));
}

int collectives() {
  const auto env = DistEnv::from_env();
  auto comm = init_comm(env, CommBackend::kGloo);
  const std::string want_backend = env.world_size == 1 ? "single" : "gloo";
  if (comm->backend() != want_backend || comm->rank() != env.rank || comm->world_size() != env.world_size) {
    std::cerr << "rank " << env.rank << ": backend " << comm->backend() << ", rank " << comm->rank() << "/"
              << comm->world_size() << "\n";
    return 1;
  }
  try {
    check_all(*comm);
    check_overlap(*comm);
  } catch (const Mismatch& e) {
    std::cerr << "rank " << env.rank << ": " << e.what() << "\n";
    return 1;
  }
  auto dropped = torch::ones({10});
  comm->all_reduce(dropped);  // never waited for: destroying the comm must still not hang
  comm->barrier();
  std::cout << "rank " << env.rank << " ok\n";
  return 0;
}

// Runs `wait`, which must throw an E: prints its message (prefixed) for the test to read and returns 0; otherwise
// says on stderr that `what` did not fail and returns 2.
template <typename E, typename Fn>
int expect_thrown(const std::string& what, const std::string& prefix, Fn&& wait) {
  try {
    wait();
  } catch (const E& e) {
    std::cout << prefix << e.what() << "\n";
    return 0;
  }
  std::cerr << "rank 0: " << what << " did not fail\n";
  return 2;
}

// A peer that dies after start-up: rank 1 exits abruptly, rank 0's next collective must fail with a CommError.
int peer_dies() {
  const auto env = DistEnv::from_env();
  auto comm = init_comm(env, CommBackend::kGloo);
  if (env.rank == 1) std::_Exit(3);
  auto t = torch::ones({1000});
  return expect_thrown<CommError>("all_reduce with a dead peer", "", [&] { comm->all_reduce(t).wait(); });
}

// A peer that is alive but never joins the collective: rank 0's all_reduce must time out after DEEPSPEED_TIMEOUT.
int peer_stuck() {
  const auto env = DistEnv::from_env();
  auto comm = init_comm(env, CommBackend::kGloo);
  if (env.rank == 1) {
    std::this_thread::sleep_for(env.timeout * 2);  // outlives rank 0's timeout, then exits cleanly
    return 0;
  }
  auto t = torch::ones({7}, torch::kBFloat16);
  return expect_thrown<CommError>("all_reduce with a stuck peer", "",
                                  [&] { comm->all_reduce(t, ReduceOp::kMax).wait(); });
}

// Rank 0 starts an all_reduce that rank 1 has not joined; another thread interrupts the comm, and the wait must
// throw the interrupting error. Only then (told through the store) does rank 1 join, so the collective completes
// and both ranks exit cleanly.
int interrupted() {
  const auto env = DistEnv::from_env();
  auto comm = init_comm(env, CommBackend::kGloo);
  auto t = torch::ones({1000});
  if (env.rank == 1) {
    comm->side_all_gather({0});
    comm->all_reduce(t).wait();
    return 0;
  }
  auto pending = comm->all_reduce(t);
  std::thread watcher([&] { comm->interrupt(std::make_exception_ptr(std::runtime_error("the watcher stopped it"))); });
  watcher.join();
  const int code =
      expect_thrown<std::runtime_error>("an interrupted all_reduce", "interrupted: ", [&] { pending.wait(); });
  if (code == 0) comm->side_all_gather({1});  // now rank 1 joins, and the collective completes
  return code;
}

// Each rank posts three records to a side stream and reads its peers' (rank 0 every rank's, the others rank 0's).
int side_stream() {
  const auto env = DistEnv::from_env();
  auto comm = init_comm(env, CommBackend::kGloo);
  auto stream = comm->open_side_stream();
  if (!stream) throw std::runtime_error("no side stream over a TCPStore");
  const std::vector<int> want_peers = env.rank == 0 ? all_but_zero(env.world_size) : std::vector<int>{0};
  if (stream->peers() != want_peers) throw Mismatch("rank " + std::to_string(env.rank) + ": unexpected peers");
  for (int64_t i = 0; i < 3; ++i) stream->post(i, {env.rank, i, 100 + i});
  for (int64_t i = 0; i < 3; ++i) {
    for (int peer : stream->peers()) {
      const auto got = stream->read(peer, i);
      if (got != std::vector<int64_t>{peer, i, 100 + i}) {
        throw Mismatch("rank " + std::to_string(env.rank) + ": record " + std::to_string(i) + " of rank " +
                       std::to_string(peer) + " is wrong");
      }
    }
  }
  comm->barrier();  // rank 0 hosts the store: nobody leaves before every record is read
  std::cout << "rank " << env.rank << " read " << 3 * stream->peers().size() << " records\n";
  return 0;
}

// The groups of a rank grid: along each axis, a comm of exactly the ranks ProcessTopology names, numbered in the
// axis's order (an all_gather of world ranks comes back as the group's list), whose collectives involve no other
// rank (an all_reduce sums the group's ranks only). Two grids in a row: successive splits do not mix their keys.
int topology() {
  const auto env = DistEnv::from_env();
  auto world = init_comm(env, CommBackend::kGloo);
  for (const auto& [pipe, model] : std::vector<std::pair<int, int>>{{2, 2}, {env.world_size / 2, 1}}) {
    const ProcessTopology topology(world->world_size(), pipe, model);
    const auto groups = make_parallel_groups(world, topology);
    if (!(groups.coord == topology.coord_of(env.rank))) throw Mismatch("coordinate");
    for (Axis axis : {Axis::kPipe, Axis::kData, Axis::kModel}) {
      const auto members = topology.group_along(axis, env.rank);
      const auto& comm = groups.along(axis);
      const std::string what = std::string(to_string(axis)) + " group of grid pipe " + std::to_string(pipe) +
                               " x model " + std::to_string(model);
      if (comm->world_size() != static_cast<int>(members.size()) || comm->rank() != groups.coord.along(axis)) {
        throw Mismatch(what + ": rank " + std::to_string(comm->rank()) + " of " + std::to_string(comm->world_size()));
      }
      auto mine = torch::full({1}, static_cast<int64_t>(env.rank), torch::kLong);
      auto all = torch::zeros({comm->world_size()}, torch::kLong);
      comm->all_gather(all, mine).wait();
      expect_equal(what + " all_gather", all, torch::tensor(std::vector<int64_t>(members.begin(), members.end())));
      auto sum = mine.clone();
      comm->all_reduce(sum).wait();
      int64_t want = 0;
      for (int r : members) want += r;
      expect_equal(what + " all_reduce", sum, torch::full({1}, want, torch::kLong));
    }
  }
  world->barrier();
  std::cout << "rank " << env.rank << " ok\n";
  return 0;
}

// A ring: each rank sends to the next and receives from the previous — two messages on one tag (they arrive in
// order), one on another tag, fp32 and bf16 (moved as bits: every value exact) — all sends posted before any
// receive, so a send that waited for its receiver would hang the ring. Then the same over a pipe group of a grid,
// and a send to itself, which names the rule.
int point_to_point() {
  const auto env = DistEnv::from_env();
  auto world = init_comm(env, CommBackend::kGloo);
  auto ring = [&](Comm& comm, const std::string& what) {
    const int w = comm.world_size(), r = comm.rank(), next = (r + 1) % w, prev = (r + w - 1) % w;
    auto message = [](int from, int k, torch::ScalarType dtype) {
      return (torch::arange(5, torch::kFloat) + 0.5 + 10.0 * from + 100.0 * k).to(dtype);
    };
    std::vector<torch::Tensor> out;
    std::vector<Handle> sends;
    for (int k = 0; k < 3; ++k) {
      out.push_back(message(r, k, k == 2 ? torch::kBFloat16 : torch::kFloat));
      sends.push_back(comm.send(out.back(), next, /*tag=*/k == 1 ? 7 : 0));
    }
    // Tag 7 first, though it was sent second: tags are separate channels.
    auto tagged = torch::empty({5}, torch::kFloat);
    comm.recv(tagged, prev, 7).wait();
    expect_equal(what + " tag 7", tagged, message(prev, 1, torch::kFloat));
    auto first = torch::empty({5}, torch::kFloat);
    auto second = torch::empty({5}, torch::kBFloat16);
    comm.recv(first, prev, 0).wait();
    comm.recv(second, prev, 0).wait();
    expect_equal(what + " first on tag 0", first, message(prev, 0, torch::kFloat));
    expect_equal(what + " second on tag 0", second, message(prev, 2, torch::kBFloat16));
    for (auto& h : sends) h.wait();
  };
  ring(*world, "world");
  const auto groups = make_parallel_groups(world, ProcessTopology(world->world_size(), world->world_size() / 2, 1));
  ring(*groups.pipe, "pipe group");
  const int code = expect_thrown<std::invalid_argument>("a send to itself", "is not another rank", [&] {
    world->send(torch::zeros({1}), world->rank());
  });
  world->barrier();
  if (code == 0) std::cout << "rank " << env.rank << " ok\n";
  return code;
}

// Start-up with a rank missing: init_comm itself must fail within DEEPSPEED_TIMEOUT.
int missing_peer() {
  try {
    init_comm(DistEnv::from_env(), CommBackend::kGloo);
  } catch (const CommError& e) {
    std::cout << e.what() << "\n";
    return 0;
  }
  std::cerr << "init_comm without all ranks did not fail\n";
  return 2;
}

}  // namespace

int run_worker(const std::string& scenario) {
  try {
    if (scenario == "collectives") return collectives();
    if (scenario == "peer_dies") return peer_dies();
    if (scenario == "peer_stuck") return peer_stuck();
    if (scenario == "missing_peer") return missing_peer();
    if (scenario == "interrupted") return interrupted();
    if (scenario == "side_stream") return side_stream();
    if (scenario == "topology") return topology();
    if (scenario == "point_to_point") return point_to_point();
    std::cerr << "unknown worker scenario '" << scenario << "'\n";
  } catch (const std::exception& e) {
    std::cerr << "worker " << scenario << " failed: " << e.what() << "\n";
  }
  return 1;
}

}  // namespace dscpp::testing
