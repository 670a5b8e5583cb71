// CommsLogger and the Comm decorator that feeds it.
#include "dscpp/comm/comms_logger.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "dscpp/monitor/step_log.h"

namespace dscpp {
namespace {

using Clock = std::chrono::steady_clock;

// `group`: "" for the comm the logger was made for; "[n]" for a sub-group of n ranks split from it, whose ops are
// recorded under their own names ("all_gather[2]") so a summary tells the traffic of each apart (ZeRO++'s hpZ groups).
class LoggedComm final : public Comm {
 public:
  LoggedComm(std::shared_ptr<Comm> inner, std::shared_ptr<CommsLogger> logger, std::string group = "")
      : inner_(std::move(inner)), logger_(std::move(logger)), group_(std::move(group)) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }

  Handle all_reduce(torch::Tensor& tensor, ReduceOp op) override {
    return timed("all_reduce", tensor.nbytes(), [&] { return inner_->all_reduce(tensor, op); });
  }
  Handle reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override {
    return timed("reduce_scatter", input.nbytes(), [&] { return inner_->reduce_scatter(output, input, op); });
  }
  Handle all_gather(torch::Tensor& output, const torch::Tensor& input) override {
    return timed("all_gather", output.nbytes(), [&] { return inner_->all_gather(output, input); });
  }
  Handle broadcast(torch::Tensor& tensor, int root) override {
    return timed("broadcast", tensor.nbytes(), [&] { return inner_->broadcast(tensor, root); });
  }
  Handle all_to_all(torch::Tensor& output, const torch::Tensor& input) override {
    return timed("all_to_all", input.nbytes(), [&] { return inner_->all_to_all(output, input); });
  }
  Handle send(const torch::Tensor& tensor, int peer, int tag) override {
    return timed("send", tensor.nbytes(), [&] { return inner_->send(tensor, peer, tag); });
  }
  Handle recv(torch::Tensor& tensor, int peer, int tag) override {
    return timed("recv", tensor.nbytes(), [&] { return inner_->recv(tensor, peer, tag); });
  }
  void barrier() override {
    const auto start = Clock::now();
    inner_->barrier();
    if (logger_->wants("barrier")) logger_->record("barrier", 0, seconds_since(start));
  }
  std::vector<int64_t> side_all_gather(const std::vector<int64_t>& values) override {
    return inner_->side_all_gather(values);  // store traffic, not a collective on the process group
  }
  std::unique_ptr<SideStream> open_side_stream() override { return inner_->open_side_stream(); }
  void interrupt(std::exception_ptr error) override { inner_->interrupt(std::move(error)); }
  std::shared_ptr<Comm> split(int color, int key) override {
    auto sub = inner_->split(color, key);
    const std::string group = "[" + std::to_string(sub->world_size()) + "]";
    return std::make_shared<LoggedComm>(std::move(sub), logger_, group);
  }

 private:
  static double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  template <typename Launch>
  Handle timed(const char* op, size_t bytes, Launch launch) {
    if (!logger_->wants(op)) return launch();
    const auto start = Clock::now();
    auto handle = std::make_shared<Handle>(launch());
    return Handle([handle, start, name = op + group_, bytes, logger = logger_] {
      handle->wait();
      logger->record(name, static_cast<int64_t>(bytes), seconds_since(start));
    });
  }

  std::shared_ptr<Comm> inner_;
  std::shared_ptr<CommsLogger> logger_;
  std::string group_;
};

// "all_gather[2]" → ("all_gather", 2); a name without a group → (name, `world`).
std::pair<std::string, int> op_and_group(const std::string& name, int world) {
  const auto open = name.find('[');
  if (open == std::string::npos || name.back() != ']') return {name, world};
  return {name.substr(0, open), std::stoi(name.substr(open + 1, name.size() - open - 2))};
}

}  // namespace

double bus_factor(const std::string& op, int n) {
  if (n <= 1) return 0.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return static_cast<double>(n - 1) / n;
  if (op == "broadcast" || op == "send" || op == "recv") return 1.0;  // the message crosses one link
  return 0.0;
}

CommsLogger::CommsLogger(const CommsLoggerConfig& config, int rank, int world_size,
                         std::function<void(const std::string&)> log)
    : config_(config), rank_(rank), world_(world_size), log_(std::move(log)) {}

bool CommsLogger::wants(const std::string& op) const {
  return config_.prof_all || std::find(config_.prof_ops.begin(), config_.prof_ops.end(), op) != config_.prof_ops.end();
}

void CommsLogger::record(const std::string& op, int64_t bytes, double seconds) {
  const double algbw = seconds > 0 ? bytes / seconds : 0.0;
  const auto [base, group_size] = op_and_group(op, world_);  // a sub-group's op moves what its own size implies
  const double busbw = algbw * bus_factor(base, group_size);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& s = stats_[op][bytes];
    s.min_s = s.count == 0 ? seconds : std::min(s.min_s, seconds);
    s.max_s = std::max(s.max_s, seconds);
    ++s.count;
    s.bytes += bytes;
    s.total_s += seconds;
    s.algbw_sum += algbw;
    s.busbw_sum += busbw;
  }
  if ((config_.verbose && rank_ == 0) || config_.debug) {
    char line[256];
    std::snprintf(line, sizeof line, "[comms] rank %d: %s | %s | %.3f ms | algbw %s/s | busbw %s/s", rank_, op.c_str(), format_bytes(static_cast<double>(bytes)).c_str(),
                  seconds * 1e3, format_bytes(algbw).c_str(), format_bytes(busbw).c_str());
    log_(line);
  }
}

std::map<std::string, std::map<int64_t, CommOpStats>> CommsLogger::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::string CommsLogger::summary() const {
  const auto all = stats();
  std::string out = "[comms] summary, rank " + std::to_string(rank_) + " of " + std::to_string(world_) +
                    " (latency from call to end of wait)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-15s %12s %8s %12s %10s %10s %10s %14s %14s\n", "op", "message", "count",
                "total ms", "avg ms", "min ms", "max ms", "algbw avg", "busbw avg");
  out += line;
  for (const auto& [op, sizes] : all) {
    for (const auto& [bytes, s] : sizes) {
      std::snprintf(line, sizeof line, "%-15s %12s %8lld %12.3f %10.3f %10.3f %10.3f %12s/s %12s/s\n", op.c_str(),
                    format_bytes(static_cast<double>(bytes)).c_str(), static_cast<long long>(s.count), s.total_s * 1e3,
                    s.total_s / s.count * 1e3, s.min_s * 1e3, s.max_s * 1e3,
                    format_bytes(s.algbw_sum / s.count).c_str(), format_bytes(s.busbw_sum / s.count).c_str());
      out += line;
    }
  }
  return out;
}

std::shared_ptr<Comm> make_logged_comm(std::shared_ptr<Comm> inner, std::shared_ptr<CommsLogger> logger) {
  return std::make_shared<LoggedComm>(std::move(inner), std::move(logger));
}

}  // namespace dscpp
