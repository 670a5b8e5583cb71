// dscpp._C's tensor-parallel half: the sliced layers' forwards of dscpp/parallel/tensor_parallel_layers.h for the
// layers AutoTP puts into a Python model (dscpp.module_inject.layers). The slicing is Python's (it rewrites the
// model's own modules); the arithmetic around each collective and the collectives stay the C++ ones, shared with
// the C++ front end's ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <memory>
#include <optional>

#include "dscpp/parallel/tensor_parallel_layers.h"
#include "dscpp/parallel/tensor_parallel_ops.h"

namespace py = pybind11;

namespace dscpp::python {

void bind_parallel(py::module_& m) {
  // The GIL is released while a collective waits, as in sequence.cpp: Gloo's worker thread may need it meanwhile.
  // An undefined bias comes from Python's None.
  m.def(
      "column_parallel_linear",
      [](const torch::Tensor& x, const torch::Tensor& weight, const std::optional<torch::Tensor>& bias,
         const std::shared_ptr<Comm>& group) {
        return column_parallel_linear(x, weight, bias.value_or(torch::Tensor()), group);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "x·Wᵀ + b with W this rank's output rows (out/p, in): this rank's output columns.");
  m.def(
      "row_parallel_linear",
      [](const torch::Tensor& x, const torch::Tensor& weight, const std::optional<torch::Tensor>& bias,
         const std::shared_ptr<Comm>& group) {
        return row_parallel_linear(x, weight, bias.value_or(torch::Tensor()), group);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "x·Wᵀ + b with W this rank's input columns (out, in/p) and x this rank's columns of the input: the whole "
      "output, all-reduced over `group`, the whole bias added once.");
  m.def("vocab_parallel_embedding", &vocab_parallel_embedding, py::arg("ids"), py::arg("weight"),
        py::arg("vocab_begin"), py::arg("group"), py::call_guard<py::gil_scoped_release>(),
        "The whole lookup of `ids` in a table whose rows [vocab_begin, vocab_begin + weight.size(0)) are this "
        "rank's: the other rows look up zeros here and the all-reduce fills them in.");
  m.def("gather_from_model_parallel", &gather_from_model_parallel, py::arg("x"), py::arg("group"),
        py::call_guard<py::gil_scoped_release>(),
        "x (…, n) on every rank → (…, n · group size), rank r's columns at [r·n, (r+1)·n).");
  m.def("scatter_to_model_parallel", &scatter_to_model_parallel, py::arg("x"), py::arg("group"),
        py::call_guard<py::gil_scoped_release>(),
        "x (…, n · group size) → (…, n), this rank's columns; backward all-gathers them (Megatron's scatter).");
}

}  // namespace dscpp::python
