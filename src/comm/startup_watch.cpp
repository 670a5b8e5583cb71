// StartupWatch: see the header for why a rank stops itself when another one's start-up failed.
#include "startup_watch.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "process_group_comm.h"
#include "rendezvous.h"
#include "store_side_channel.h"

namespace dscpp {
namespace {

const std::string kFailedKey = "dscpp/startup/failed";
std::string read_key(int rank) { return "dscpp/startup/read/" + std::to_string(rank); }

std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace

StartupWatch::StartupWatch(const c10::intrusive_ptr<c10d::Store>& store, const DistEnv& env, std::string who)
    : store_(store),
      rank_(env.rank),
      world_size_(env.world_size),
      hosts_store_(env.rank == 0 && !env.agent_store),
      who_(std::move(who)),
      master_(env.master_addr + ":" + std::to_string(env.master_port)) {
  const auto* server = tcp_store_under(store.get());
  if (server == nullptr || world_size_ == 1) return;
  c10d::TCPStoreOptions options;
  options.port = server->getPort();
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = store->getTimeout();
  try {
    reader_ = c10::make_intrusive<c10d::TCPStore>(server->getHost(), options);
  } catch (const std::exception&) {
    return;  // the store is already gone: connecting the group will fail and say so
  }
  // Under torchrun's agent store the keys live per attempt, as the rendezvous store's do (rendezvous.cpp).
  if (env.agent_store)
    reader_ = c10::make_intrusive<c10d::PrefixStore>(agent_attempt_prefix(env), reader_);
  thread_ = std::thread([this] { watch(); });
}

StartupWatch::~StartupWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StartupWatch::report_failure(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;  // this rank's own report is not a reason to stop it from the watch thread
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  const std::string report = who_ + " failed during start-up: " + why;
  try {
    if (!store_->check({kFailedKey})) store_->set(kFailedKey, std::vector<uint8_t>(report.begin(), report.end()));
    if (!hosts_store_) return;
    std::vector<std::string> readers;
    for (int r = 0; r < world_size_; ++r)
      if (r != rank_) readers.push_back(read_key(r));
    const auto deadline = std::chrono::steady_clock::now() + kAckWait;
    while (!store_->check(readers) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(kPoll / 2);
  } catch (const std::exception&) {
    // The store is unusable: the other ranks see it lost, which says as much.
  }
}

void StartupWatch::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, kPoll, [this] { return stopping_; })) {
    lock.unlock();
    std::string report;
    bool lost = false;
    try {
      if (reader_->check({kFailedKey})) {
        report = text_of(reader_->get(kFailedKey));
        reader_->set(read_key(rank_), std::vector<uint8_t>{1});
      }
    } catch (const std::exception&) {
      lost = true;
    }
    lock.lock();
    if (stopping_) return;  // start-up finished meanwhile: whatever was seen is no longer this rank's concern
    if (!report.empty()) stop_process("stopping, because " + report);
    if (lost) {
      stop_process("lost the rendezvous store at " + master_ + " during start-up: rank 0, which hosts it there, " +
                   "exited or its host went away; see its log");
    }
  }
}

void StartupWatch::stop_process(const std::string& text) const {
  std::cerr << "[dscpp] " << who_ << ": " << text << std::endl;
  std::fflush(nullptr);
  std::_Exit(1);
}

}  // namespace dscpp
