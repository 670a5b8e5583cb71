// What torch_pickle.cpp (reading) and torch_pickle_writer.cpp (writing) share beyond torch_pickle.h: a fresh value of
// a kind, and the name of a dtype's storage type, from the one list of names the reader allows (kAllowedGlobals).
#pragma once

#include <c10/core/ScalarType.h>

#include "dscpp/checkpoint/torch_pickle.h"

namespace dscpp {

// A new, empty value of `kind` (the builders in torch_pickle.h fill one in; the reader's stack pushes them).
PyRef make_value(PyValue::Kind kind);

// "torch.FloatStorage" for float32, ...; throws std::runtime_error for a dtype without one.
const char* torch_storage_type(c10::ScalarType dtype);

}  // namespace dscpp
