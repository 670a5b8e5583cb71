// Reading a file that Python's torch.save wrote (the zip format of torch >= 1.6: `data.pkl`, a pickle, beside one
// record per tensor storage) without Python and without executing anything it names. DeepSpeed's checkpoints are
// such files; reading them is how a run continues from DeepSpeed (dscpp/checkpoint/deepspeed_checkpoint.h).
//
// A pickle is a program: its GLOBAL opcodes name any Python callable and its REDUCE opcodes call them, which is why
// torch.load(weights_only=False) on a file from elsewhere can run anything. This reader is a pickle machine that
// knows values, containers and tensors, plus the few names torch.save and DeepSpeed write (kAllowedGlobals in
// torch_pickle.cpp, the one list); a file naming anything else is refused with that name, before anything from it
// is used.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dscpp {

struct PyValue;
// Shared: pickle's memo refers to one object from several places, and containers are filled after they are memoized.
using PyRef = std::shared_ptr<PyValue>;

// One Python value of the pickle.
struct PyValue {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kList,
    kTuple,
    kDict,    // dict and collections.OrderedDict, in insertion order
    kTensor,
    kObject,  // an instance of an allowed class: `name` is its class, `items` its constructor arguments, `state` BUILD's
    kGlobal,  // an allowed name used as a value (a storage type, a torch.dtype) or about to be called
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0.0;
  std::string text;  // kString, kBytes; kObject and kGlobal: "module.qualname"
  std::vector<PyRef> items;  // kList, kTuple, kObject's arguments
  std::vector<std::pair<PyRef, PyRef>> entries;  // kDict
  torch::Tensor tensor;
  PyRef state;  // kObject: what BUILD gave it (a dict for DeepSpeed's classes), or null
  // The reader's bookkeeping: the containers nested in this one (itself included), and whether it was placed in
  // another (after which a pickle may not change it: no value contains itself, and nesting is bounded).
  int depth = 0;
  bool sealed = false;

  // The dict entry under a string key, or null (also when this is not a dict).
  const PyValue* find(const std::string& key) const;
  // The dict entry under an int key (torch's optimizer state is keyed by index), or null.
  const PyValue* find(int64_t key) const;
  // The same, throwing std::runtime_error naming `where` and the key when it is missing.
  const PyValue& at(const std::string& key, const std::string& where) const;
  // An object's attribute: its state dict's entry (null when absent).
  const PyValue* attribute(const std::string& name) const;

  bool is_none() const { return kind == Kind::kNone; }
  // Typed reads, throwing std::runtime_error naming `where` and the value's kind on a mismatch (an int reads as a
  // double; a bool as an int, as in Python).
  int64_t as_int(const std::string& where) const;
  double as_double(const std::string& where) const;
  bool as_bool(const std::string& where) const;
  const std::string& as_string(const std::string& where) const;
  const torch::Tensor& as_tensor(const std::string& where) const;
  const std::vector<PyRef>& as_sequence(const std::string& where) const;  // a list or a tuple

  // "int", "OrderedDict", "deepspeed...LossScaler" — for error messages.
  std::string kind_name() const;
};

// Builders for writing: plain values, containers (a dict keeps the order given), tensors, and objects of a named
// class — with `state` (a dict) written as the class's attributes, as Python pickles a plain class instance; without,
// as a call of the class with `args` (how an Enum or torch.Size pickles).
PyRef py_none();
PyRef py_bool(bool value);
PyRef py_int(int64_t value);
PyRef py_float(double value);
PyRef py_str(std::string value);
PyRef py_list(std::vector<PyRef> items);
PyRef py_tuple(std::vector<PyRef> items);
PyRef py_dict(std::vector<std::pair<std::string, PyRef>> entries);
PyRef py_tensor(torch::Tensor tensor);
PyRef py_object(std::string qualified_class, std::vector<PyRef> args, PyRef state = nullptr);

// Writes `value` as torch.save does (zip format, pickle protocol 2), so Python's torch.load reads it — with
// weights_only=True when it holds only values, containers and tensors. Each tensor is written contiguous, on the CPU,
// as its own storage. Throws std::runtime_error naming `path` when it cannot be written or a value has no pickle
// form here (bytes, a global).
void save_torch_file(const std::string& path, const PyValue& value);

// Reads `path`, a torch.save file, into its value; tensors are CPU tensors holding their own copy of the bytes.
// Throws std::runtime_error naming the file when it cannot be opened, is not a zip-format torch.save file (written
// by torch < 1.6), is truncated or corrupt, or names a Python object outside the allowed list (naming the object).
PyRef load_torch_file(const std::string& path);

}  // namespace dscpp
