// CommsLogger (DeepSpeed's comms_logger): every collective the engine issues, by op and message size — count,
// bytes, latency, algorithm and bus bandwidth — summarised on demand and when the engine ends. make_logged_comm
// puts it in front of a Comm, so nothing else changes to be measured.
//
// Latency is from the call to the end of its wait(): what the caller waited for, overlap included. Bandwidths follow
// NCCL's tests: algorithm bandwidth = message bytes / latency; bus bandwidth scales it by what each rank must move,
// 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast, so it compares
// with the link.
// The message of all_gather is its output, of reduce_scatter and all_to_all their input: the whole buffer in all.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "dscpp/comm/comm.h"
#include "dscpp/config/config.h"

namespace dscpp {

struct CommOpStats {
  int64_t count = 0;
  int64_t bytes = 0;           // message bytes, summed over the calls
  double total_s = 0;          // latency, summed
  double min_s = 0, max_s = 0;
  double busbw_sum = 0;        // bytes/s, summed over the calls (averaged in the summary)
  double algbw_sum = 0;
};

class CommsLogger {
 public:
  // `log` gets verbose lines (rank 0, or every rank with debug).
  CommsLogger(const CommsLoggerConfig& config, int rank, int world_size,
              std::function<void(const std::string&)> log);

  bool wants(const std::string& op) const;
  void record(const std::string& op, int64_t bytes, double seconds);

  // op → message bytes → stats.
  std::map<std::string, std::map<int64_t, CommOpStats>> stats() const;
  // One line per op and size: "all_reduce  4.00 MB  count 12  total 31.2 ms  avg 2.60 ms  algbw 1.54 GB/s
  // busbw 1.54 GB/s", with a header.
  std::string summary() const;

 private:
  CommsLoggerConfig config_;
  int rank_, world_;
  std::function<void(const std::string&)> log_;
  mutable std::mutex mutex_;
  std::map<std::string, std::map<int64_t, CommOpStats>> stats_;
};

// How much of a collective's algorithm bandwidth each rank's link carries (the NCCL tests' bus factor).
double bus_factor(const std::string& op, int world_size);

// `inner`, with each collective recorded in `logger` when its wait() returns.
std::shared_ptr<Comm> make_logged_comm(std::shared_ptr<Comm> inner, std::shared_ptr<CommsLogger> logger);

}  // namespace dscpp
