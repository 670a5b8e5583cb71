// dscpp._C's Mixture-of-Experts half: the C++ TokenDispatcher (gate, dispatch, all-to-all, combine) for
// dscpp.moe.layer.MoE, whose experts are Python modules, and the expert groups' rank lists for dscpp.utils.groups.
// Routing and token movement stay one implementation, the C++ one, for both front ends.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <memory>
#include <optional>
#include <string>

#include "dscpp/moe/expert_groups.h"
#include "dscpp/moe/token_dispatcher.h"

namespace py = pybind11;

namespace dscpp::python {
namespace {

// DeepSpeed's TopKGate options as the Python layer takes them (noisy_gate_policy None or a name).
moe::GateOptions gate_options(int k, double capacity_factor, double eval_capacity_factor, int64_t min_capacity,
                              const std::optional<std::string>& noisy_gate_policy, bool drop_tokens, bool use_rts,
                              bool top2_2nd_expert_sampling) {
  moe::GateOptions gate;
  gate.k = k;
  gate.capacity_factor = capacity_factor;
  gate.eval_capacity_factor = eval_capacity_factor;
  gate.min_capacity = min_capacity;
  gate.noisy_gate_policy = moe::parse_noisy_gate_policy(noisy_gate_policy.value_or("None"));
  gate.drop_tokens = drop_tokens;
  gate.use_rts = use_rts;
  gate.top2_2nd_expert_sampling = top2_2nd_expert_sampling;
  gate.validate();
  return gate;
}

}  // namespace

void bind_moe(py::module_& m) {
  // std::invalid_argument reaches Python as ValueError, with the C++ message naming the option and its value.
  m.def(
      "check_moe_options",
      [](int64_t num_experts, int ep_size, int k, double capacity_factor, double eval_capacity_factor,
         int64_t min_capacity, const std::optional<std::string>& noisy_gate_policy) {
        gate_options(k, capacity_factor, eval_capacity_factor, min_capacity, noisy_gate_policy, true, true, true);
        moe::check_expert_counts(num_experts, ep_size, k);
      },
      py::arg("num_experts"), py::arg("ep_size"), py::arg("k"), py::arg("capacity_factor"),
      py::arg("eval_capacity_factor"), py::arg("min_capacity"), py::arg("noisy_gate_policy"),
      "ValueError naming the option for what DeepSpeed's MoE asserts (and what our gate refuses).");
  m.def("expert_parallel_ranks", &moe::expert_parallel_ranks, py::arg("data_size"), py::arg("ep_size"));
  m.def("expert_data_parallel_ranks", &moe::expert_data_parallel_ranks, py::arg("data_size"), py::arg("ep_size"));

  py::class_<moe::DispatchedTokens>(m, "DispatchedTokens")
      .def_readonly("expert_inputs", &moe::DispatchedTokens::expert_inputs)
      .def_readonly("l_aux", &moe::DispatchedTokens::l_aux)
      .def_readonly("exp_counts", &moe::DispatchedTokens::exp_counts);
  py::class_<moe::TokenDispatcher, std::shared_ptr<moe::TokenDispatcher>>(m, "TokenDispatcher")
      .def(py::init([](int64_t num_experts, int k, double capacity_factor, double eval_capacity_factor,
                       int64_t min_capacity, const std::optional<std::string>& noisy_gate_policy, bool drop_tokens,
                       bool use_rts, bool top2_2nd_expert_sampling, std::shared_ptr<Comm> ep_group) {
             return std::make_shared<moe::TokenDispatcher>(
                 num_experts,
                 gate_options(k, capacity_factor, eval_capacity_factor, min_capacity, noisy_gate_policy, drop_tokens,
                              use_rts, top2_2nd_expert_sampling),
                 std::move(ep_group));
           }),
           py::arg("num_experts"), py::arg("k"), py::arg("capacity_factor"), py::arg("eval_capacity_factor"),
           py::arg("min_capacity"), py::arg("noisy_gate_policy"), py::arg("drop_tokens"), py::arg("use_rts"),
           py::arg("top2_2nd_expert_sampling"), py::arg("ep_group") = py::none())
      // Both exchange tokens over the expert-parallel group: other Python threads may run meanwhile.
      .def("dispatch", &moe::TokenDispatcher::dispatch, py::arg("tokens"), py::arg("gate_weight"),
           py::arg("training"), py::call_guard<py::gil_scoped_release>())
      .def("combine", &moe::TokenDispatcher::combine, py::arg("expert_outputs"), py::arg("dispatched"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("ep_size", &moe::TokenDispatcher::ep_size)
      .def_property_readonly("num_local_experts", &moe::TokenDispatcher::num_local_experts)
      .def_property_readonly("first_local_expert", &moe::TokenDispatcher::first_local_expert)
      .def_property_readonly("all_to_all_seconds", &moe::TokenDispatcher::all_to_all_seconds);
}

}  // namespace dscpp::python
