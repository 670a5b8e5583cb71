// StartupWatch: ends this rank's start-up when another rank's has failed, instead of leaving it blocked in Gloo.
// Connecting a Gloo process group blocks in connect/accept until every pair is up or the job's timeout (30 min by
// default) passes, and cannot be interrupted. When one rank fails there — a peer advertised an address it cannot
// reach, say — the others would sit out the whole timeout, on every host. So while the group connects, each rank
// watches the store on a connection of its own: a failing rank reports "rank R on host H: why" under a store key, and
// every other rank prints that and exits at once; a rank that loses the store (rank 0, its host, died) says so and
// exits too. Exiting is the only way out of a blocked connect; nothing has been trained or saved yet.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "c10d_headers.h"
#include "dscpp/comm/dist_env.h"

namespace dscpp {

class StartupWatch {
 public:
  // Starts watching `store` (the rendezvous store every rank shares). `who` names this rank for messages, e.g.
  // "rank 1/4 on host node1 (10.0.0.2)". Without a TCPStore under `store`, watches nothing.
  StartupWatch(const c10::intrusive_ptr<c10d::Store>& store, const DistEnv& env, std::string who);
  ~StartupWatch();  // stops watching (start-up succeeded, or this rank reported its own failure)
  StartupWatch(const StartupWatch&) = delete;
  StartupWatch& operator=(const StartupWatch&) = delete;

  // This rank failed to start: tells the others why (through `store_`, from the thread that was connecting). The
  // rank hosting the store waits, at most kAckWait, until every other rank has read it, so that its exit does not
  // take the report down with the store.
  void report_failure(const std::string& why);

  static constexpr std::chrono::milliseconds kPoll{100};
  static constexpr std::chrono::seconds kAckWait{10};

 private:
  void watch();
  [[noreturn]] void stop_process(const std::string& text) const;

  c10::intrusive_ptr<c10d::Store> store_;   // the caller's; used only by report_failure
  c10::intrusive_ptr<c10d::Store> reader_;  // a connection of the watch thread's own (TCPStore is not thread-safe)
  int rank_;
  int world_size_;
  bool hosts_store_;
  std::string who_;
  std::string master_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dscpp
