// dscpp._C's sequence-parallel half: DeepSpeed-Ulysses' all-to-alls (dscpp/sequence/distributed_attention.h) for
// dscpp.sequence.layer.DistributedAttention, whose local attention is the model's own Python module. The exchanges
// and their layout stay one implementation, the C++ one, for both front ends.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <torch/extension.h>

#include <memory>

#include "dscpp/sequence/distributed_attention.h"
#include "dscpp/sequence/tiled_loss.h"

namespace py = pybind11;

namespace dscpp::python {

void bind_sequence(py::module_& m) {
  // std::invalid_argument reaches Python as ValueError, naming the sizes. The GIL is released while the exchanges
  // wait: the group's own worker thread may need it meanwhile (Gloo's run loop frees a finished work's tensors, which
  // can be Python's, on that thread), and a rank blocked in the all-to-all holding it would wait forever.
  m.def("seq_all_to_all", &seq_all_to_all, py::arg("input"), py::arg("group"), py::arg("scatter_dim"),
        py::arg("gather_dim"), py::call_guard<py::gil_scoped_release>(),
        "Ulysses' all-to-all over `group` (a dscpp._C.Comm): chunk j of `input` along scatter_dim to rank j, the "
        "received chunks concatenated along gather_dim in rank order; differentiable (the gradient goes back).");
  m.def(
      "distributed_attention",
      [](const std::shared_ptr<Comm>& group, const py::function& local_attention, const torch::Tensor& query,
         const torch::Tensor& key, const torch::Tensor& value, int64_t batch_dim) {
        DistributedAttention attention(
            [&local_attention](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
              py::gil_scoped_acquire gil;  // the model's attention is Python
              return local_attention(q, k, v).cast<torch::Tensor>();
            },
            group);
        py::gil_scoped_release no_gil;  // as seq_all_to_all: never wait in a collective holding the GIL
        return attention.forward(query, key, value, batch_dim);
      },
      py::arg("group"), py::arg("local_attention"), py::arg("query"), py::arg("key"), py::arg("value"),
      py::arg("batch_dim"),
      "DistributedAttention::forward over `group` with `local_attention(q, k, v)` (a Python callable) between the "
      "exchanges.");
  m.def("tiled_cross_entropy", &tiled_cross_entropy, py::arg("hidden"), py::arg("head"), py::arg("targets"),
        py::arg("tile"), py::arg("vocab") = -1,
        "Mean cross-entropy of hidden (N, C) · head (V, C)ᵀ against targets (N), `tile` positions at a time: the "
        "whole logits never exist (dscpp/sequence/tiled_loss.h).");
}

}  // namespace dscpp::python
