// ModelStateMemory formatting.
#include "dscpp/engine/memory_report.h"

#include "dscpp/monitor/step_log.h"

namespace dscpp {

std::string describe(const ModelStateMemory& m) {
  auto b = [](int64_t bytes) { return format_bytes(static_cast<double>(bytes)); };
  return "model states " + b(m.model_states()) + " per rank: params " + b(m.stage.params16) + ", grads " +
         b(m.stage.grads16) + ", fp32 master " + b(m.stage.master) + ", optimizer state " + b(m.optimizer_state) +
         "; buffers " + b(m.stage.buffers) +
         (m.stage.persistent > 0 ? "; persistent params " + b(m.stage.persistent) : std::string()) +
         (m.stage.gathered_peak > 0 ? "; gathered peak " + b(m.stage.gathered_peak) : std::string()) +
         (m.stage.secondary > 0 ? "; hpZ secondary shards " + b(m.stage.secondary) : std::string()) +
         (m.stage.frozen > 0 ? "; frozen params " + b(m.stage.frozen) + " (in params)" : std::string());
}

nlohmann::json to_json(const ModelStateMemory& m) {
  return {{"params", m.stage.params16},     {"grads", m.stage.grads16},  {"master", m.stage.master},
          {"optimizer_state", m.optimizer_state}, {"buffers", m.stage.buffers}, {"model_states", m.model_states()},
          {"persistent", m.stage.persistent},       {"gathered_peak", m.stage.gathered_peak},
          {"frozen", m.stage.frozen}};
}

std::vector<int64_t> MemoryBreakdown::pack() const {
  const auto& s = states.stage;
  return {s.params16, s.grads16, s.master, s.buffers, s.persistent, s.gathered_peak, states.optimizer_state,
          activations_peak, offloaded_host, nvme, rss, live_tensors};
}

MemoryBreakdown MemoryBreakdown::unpack(const int64_t* v) {
  MemoryBreakdown m;
  auto& s = m.states.stage;
  s.params16 = v[0], s.grads16 = v[1], s.master = v[2], s.buffers = v[3], s.persistent = v[4], s.gathered_peak = v[5];
  m.states.optimizer_state = v[6];
  m.activations_peak = v[7], m.offloaded_host = v[8], m.nvme = v[9], m.rss = v[10], m.live_tensors = v[11];
  return m;
}

std::string describe(const MemoryBreakdown& m, int rank) {
  auto b = [](int64_t bytes) { return format_bytes(static_cast<double>(bytes)); };
  const auto& s = m.states.stage;
  return "memory rank " + std::to_string(rank) + ": params " + b(s.params16) + " (gathered peak " +
         b(s.gathered_peak) + "), grads " + b(s.grads16) + ", fp32 master " + b(s.master) + ", optimizer state " +
         b(m.states.optimizer_state) + ", comm buffers " + b(s.buffers) + ", activations peak " +
         (m.activations_peak < 0 ? std::string("not measured") : b(m.activations_peak)) + ", host offload " +
         b(m.offloaded_host) + ", nvme " + b(m.nvme) + ", rss " + b(m.rss) + ", live tensors " +
         (m.live_tensors < 0 ? std::string("not measured") : b(m.live_tensors));
}

nlohmann::json to_json(const MemoryBreakdown& m) {
  auto out = to_json(m.states);
  out["activations_peak"] = m.activations_peak;
  out["offloaded_host"] = m.offloaded_host;
  out["nvme"] = m.nvme;
  out["rss"] = m.rss;
  out["live_tensors"] = m.live_tensors;
  return out;
}

}  // namespace dscpp
