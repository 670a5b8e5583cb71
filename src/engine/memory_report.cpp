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
         (m.stage.gathered_peak > 0 ? "; gathered peak " + b(m.stage.gathered_peak) : std::string());
}

nlohmann::json to_json(const ModelStateMemory& m) {
  return {{"params", m.stage.params16},     {"grads", m.stage.grads16},  {"master", m.stage.master},
          {"optimizer_state", m.optimizer_state}, {"buffers", m.stage.buffers}, {"model_states", m.model_states()},
          {"persistent", m.stage.persistent},       {"gathered_peak", m.stage.gathered_peak}};
}

}  // namespace dscpp
