// OrderCheck: comparing every rank's position at each ZeRO-3 demand and boundary, behind the demands (a checker
// thread over a SideStream) or, without a stream, in place.
#include "dscpp/zero/order_check.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace dscpp {
namespace {

using RankPoint = std::pair<int, OrderPoint>;

constexpr size_t kPacked = 4;  // the integers of one point

std::vector<int64_t> pack(const OrderPoint& p) { return {p.kind, p.group, p.micro_step, p.index}; }

OrderPoint unpack(const int64_t* v) { return OrderPoint{v[0], v[1], v[2], v[3]}; }

bool operator==(const OrderPoint& a, const OrderPoint& b) {
  return a.kind == b.kind && a.group == b.group && a.micro_step == b.micro_step && a.index == b.index;
}

std::string describe(const OrderPoint& p, const std::vector<std::string>& names) {
  const std::string where = "micro-step " + std::to_string(p.micro_step);
  if (p.kind == OrderPoint::kBoundary) return "the accumulation boundary after " + where;
  if (p.kind == OrderPoint::kDemand) {
    const bool named = p.group >= 0 && p.group < static_cast<int64_t>(names.size());
    const std::string group = named ? names[static_cast<size_t>(p.group)] : "group " + std::to_string(p.group);
    return "demand #" + std::to_string(p.index) + " of " + where + " (" + group + ")";
  }
  return "an unknown point (kind " + std::to_string(p.kind) + ")";
}

// `ranks`: where each rank this one heard from was (itself included), in rank order.
std::runtime_error disagreement(int rank, const OrderPoint& mine, const std::vector<RankPoint>& ranks,
                                const std::vector<std::string>& names) {
  std::string listed;
  for (const auto& [r, p] : ranks) listed += "\n  rank " + std::to_string(r) + ": " + describe(p, names);
  return std::runtime_error(
      "ZeRO-3: ranks disagree on the next collective (rank " + std::to_string(rank) + " is at " +
      describe(mine, names) + "):" + listed +
      "\nEvery rank must run the same gather units in the same order and the same number of forward/backward "
      "passes per step; a branch that differs between ranks, or a rank with fewer micro-batches, breaks that.");
}

}  // namespace

struct OrderCheck::State {
  std::vector<std::string> names;
  std::unique_ptr<SideStream> stream;
  std::weak_ptr<Comm> comm;  // to interrupt; the checker never keeps the comm alive
  int rank = 0;

  std::mutex mutex;
  std::condition_variable changed;
  std::deque<OrderPoint> unverified;  // posted, not yet compared; the front one is point number `verified`
  int64_t posted = 0;
  int64_t verified = 0;
  std::exception_ptr disagreement;  // the first point that differed
  std::exception_ptr failure;       // the stream's, when a peer could no longer be read
  bool stop = false;
  bool reading = false;  // the checker is in a read that may wait for a peer
};

namespace {

// The checker thread: compares point i with every peer's point i, in order, as this rank posts them.
void check_points(const std::shared_ptr<OrderCheck::State>& s) {
  for (int64_t i = 0;; ++i) {
    OrderPoint mine;
    {
      std::unique_lock<std::mutex> lock(s->mutex);
      s->changed.wait(lock, [&] { return s->stop || s->posted > i; });
      if (s->stop) return;
      mine = s->unverified.front();
      s->reading = true;
    }
    std::vector<RankPoint> ranks{{s->rank, mine}};
    std::exception_ptr failure;
    try {
      for (int peer : s->stream->peers()) {
        const auto v = s->stream->read(peer, i);
        if (v.size() != kPacked) {
          throw CommError("order check: rank " + std::to_string(peer) + " sent a malformed point");
        }
        ranks.push_back({peer, unpack(v.data())});
      }
    } catch (...) {
      failure = std::current_exception();
    }
    std::sort(ranks.begin(), ranks.end(), [](const RankPoint& a, const RankPoint& b) { return a.first < b.first; });
    const bool same = std::all_of(ranks.begin(), ranks.end(), [&](const RankPoint& r) { return r.second == mine; });
    std::exception_ptr differed;
    if (!failure && !same) differed = std::make_exception_ptr(disagreement(s->rank, mine, ranks, s->names));
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      s->reading = false;
      if (failure) s->failure = failure;
      if (differed) s->disagreement = differed;
      if (!failure && !differed) {
        s->unverified.pop_front();
        s->verified = i + 1;
      }
      s->changed.notify_all();
    }
    if (failure) return;
    if (differed) {
      // A rank may be blocked in a collective that its peers, gone another way, will never join.
      if (auto comm = s->comm.lock()) comm->interrupt(differed);
      return;
    }
  }
}

}  // namespace

OrderCheck::OrderCheck(std::shared_ptr<Comm> comm, std::vector<std::string> group_names)
    : comm_(std::move(comm)), state_(std::make_shared<State>()) {
  state_->names = std::move(group_names);
  state_->rank = comm_->rank();
  state_->comm = comm_;
  if (comm_->world_size() == 1) return;
  state_->stream = comm_->open_side_stream();
  if (state_->stream) checker_ = std::thread(check_points, state_);
}

OrderCheck::~OrderCheck() {
  if (!checker_.joinable()) return;
  bool reading = false;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
    reading = state_->reading;
    state_->changed.notify_all();
  }
  // A read waits for a peer's point, which never comes if the peer died or went another way; the thread ends when
  // the read does (the store's timeout at most) and holds nothing but the shared state.
  if (reading) {
    checker_.detach();
  } else {
    checker_.join();
  }
}

void OrderCheck::post(const OrderPoint& point) {
  if (comm_->world_size() == 1) return;
  if (!state_->stream) {
    expect_same(point);
    return;
  }
  int64_t index = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->disagreement) std::rethrow_exception(state_->disagreement);
    index = state_->posted;
  }
  state_->stream->post(index, pack(point));
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->unverified.push_back(point);
    ++state_->posted;
    state_->changed.notify_all();
  }
}

void OrderCheck::expect_same(const OrderPoint& point) {
  if (comm_->world_size() == 1) return;
  if (state_->stream) {
    post(point);
    std::unique_lock<std::mutex> lock(state_->mutex);
    const int64_t through = state_->posted;
    state_->changed.wait(lock, [&] {
      return state_->verified >= through || state_->disagreement || state_->failure;
    });
    if (state_->disagreement) std::rethrow_exception(state_->disagreement);
    if (state_->failure) std::rethrow_exception(state_->failure);
    return;
  }
  // No stream: every rank's point through side_all_gather, here and now.
  const auto all = comm_->side_all_gather(pack(point));
  std::vector<RankPoint> ranks;
  for (int r = 0; r < comm_->world_size(); ++r) ranks.push_back({r, unpack(all.data() + r * kPacked)});
  for (const auto& [r, p] : ranks) {
    if (!(p == point)) throw disagreement(comm_->rank(), point, ranks, state_->names);
  }
}

}  // namespace dscpp
