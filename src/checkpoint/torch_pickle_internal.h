// What torch_pickle.cpp (reading) and torch_pickle_writer.cpp (writing) share beyond torch_pickle.h: the name of a
// dtype's storage type, from the one list of names the reader allows (kAllowedGlobals).
#pragma once

#include <c10/core/ScalarType.h>

namespace dscpp {

// "torch.FloatStorage" for float32, ...; throws std::runtime_error for a dtype without one.
const char* torch_storage_type(c10::ScalarType dtype);

}  // namespace dscpp
