// dscpp._C's LR schedules for dscpp.runtime.lr_schedules: DeepSpeed's scheduler classes (WarmupLR, OneCycle, ...)
// keep their iteration and write a torch optimizer's param groups in Python; the lr (and OneCycle's betas) at an
// iteration come from here — the same C++ schedule the engine steps for a config "scheduler" section, parsed by the
// same reader, so a class built in a script and a config section cannot disagree.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "dscpp/config/config_error.h"
#include "dscpp/config/json_reader.h"
#include "dscpp/config/sections.h"
#include "dscpp/schedule/lr_schedule.h"

namespace py = pybind11;

namespace dscpp::python {
namespace {

// One group's schedule from DeepSpeed's scheduler type and params (a JSON object of the config's "params" keys).
// `base_lr`: the group's lr (WarmupCosineLR scales it; WarmupLR without warmup_max_lr warms up to it).
std::shared_ptr<LRSchedule> lr_schedule(const std::string& type, const std::string& params_json, double base_lr) {
  nlohmann::json params = nlohmann::json::parse(params_json, nullptr, /*allow_exceptions=*/false);
  if (!params.is_object()) throw ConfigError("lr schedule params: expected a JSON object, got " + params_json);
  nlohmann::json doc = {{"scheduler", {{"type", type}, {"params", params}}}};
  ParseContext context([](const std::string& message) {
    py::module_::import("warnings").attr("warn")(message);
  });
  JsonReader root(doc, "", context);
  const auto config = parse_scheduler(root);
  return make_lr_schedule(*config, base_lr);
}

}  // namespace

void bind_schedule(py::module_& m) {
  py::class_<LRSchedule, std::shared_ptr<LRSchedule>>(m, "LRSchedule")
      .def("lr_at", &LRSchedule::lr_at, py::arg("iteration"),
           "The lr at DeepSpeed's last_batch_iteration = `iteration` (-1: the value set when built).")
      .def(
          "betas_at",
          [](const LRSchedule& schedule, int64_t iteration) -> std::optional<std::tuple<double, double>> {
            const auto betas = schedule.betas_at(iteration);
            if (!betas) return std::nullopt;
            return std::make_tuple(betas->beta1, betas->beta2);
          },
          py::arg("iteration"), "OneCycle's (beta1, beta2) at `iteration`; None for schedules that leave them.");
  m.def("lr_schedule", &lr_schedule, py::arg("type"), py::arg("params_json"), py::arg("base_lr"),
        "A scheduler type's schedule for one param group; bad params raise ConfigError naming the key.");
}

}  // namespace dscpp::python
