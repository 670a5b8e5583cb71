// Reading torch.save files (see torch_pickle.h; writing is torch_pickle_writer.cpp): a pickle machine for the opcodes
// of protocols 2-4 that torch.save and Python's pickler emit for values, containers and objects, and a fixed list of
// names a GLOBAL may bring in.
#include "dscpp/checkpoint/torch_pickle.h"

#include "torch_pickle_internal.h"

#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <map>
#include <stdexcept>

namespace dscpp {

namespace {

using Kind = PyValue::Kind;

// Every name a GLOBAL may bring in, and what it is: the one list. A torch.save of tensors in containers needs the
// first group; DeepSpeed's checkpoints add the last (plain classes and an enum, kept as their name and state: read as
// data, never constructed). Anything else is refused.
enum class Global {
  kOrderedDict,      // collections.OrderedDict(): an empty dict, filled by SETITEMS
  kRebuildTensor,    // torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, meta])
  kRebuildParameter, // torch._utils._rebuild_parameter(tensor, requires_grad, hooks)
  kRebuildFromType,  // torch._tensor._rebuild_from_type_v2(rebuild, type, args, attributes): a tensor that had
                     // Python attributes (DeepSpeed's ds_id), rebuilt as a plain tensor without them
  kTensorType,       // torch.Tensor: the only type kRebuildFromType accepts (a subclass would run its code)
  kSize,             // torch.Size(tuple): the tuple
  kEncode,           // _codecs.encode(text, "latin1"): how protocol 2 writes a bytes object
  kStorageType,      // torch.FloatStorage, ...: the dtype of a storage (BINPERSID's argument)
  kDtype,            // torch.float32, ...: a value
  kDataClass,        // a DeepSpeed class: an object with its arguments and state
};

struct AllowedGlobal {
  const char* name;
  Global what;
  c10::ScalarType dtype;  // kStorageType, kDtype
};

constexpr c10::ScalarType kNoDtype = c10::ScalarType::Undefined;

// Containers nested deeper than this are refused: DeepSpeed's files nest a few levels, and everything that walks a
// value (its destructor included) recurses once per level.
constexpr int kMaxNesting = 256;

const AllowedGlobal kAllowedGlobals[] = {
    {"collections.OrderedDict", Global::kOrderedDict, kNoDtype},
    {"torch._utils._rebuild_tensor_v2", Global::kRebuildTensor, kNoDtype},
    {"torch._utils._rebuild_parameter", Global::kRebuildParameter, kNoDtype},
    {"torch._tensor._rebuild_from_type_v2", Global::kRebuildFromType, kNoDtype},
    {"torch.Tensor", Global::kTensorType, kNoDtype},
    {"torch.Size", Global::kSize, kNoDtype},
    {"_codecs.encode", Global::kEncode, kNoDtype},
    {"torch.FloatStorage", Global::kStorageType, torch::kFloat32},
    {"torch.DoubleStorage", Global::kStorageType, torch::kFloat64},
    {"torch.HalfStorage", Global::kStorageType, torch::kFloat16},
    {"torch.BFloat16Storage", Global::kStorageType, torch::kBFloat16},
    {"torch.LongStorage", Global::kStorageType, torch::kInt64},
    {"torch.IntStorage", Global::kStorageType, torch::kInt32},
    {"torch.ShortStorage", Global::kStorageType, torch::kInt16},
    {"torch.CharStorage", Global::kStorageType, torch::kInt8},
    {"torch.ByteStorage", Global::kStorageType, torch::kUInt8},
    {"torch.BoolStorage", Global::kStorageType, torch::kBool},
    {"torch.float32", Global::kDtype, torch::kFloat32},
    {"torch.float64", Global::kDtype, torch::kFloat64},
    {"torch.float16", Global::kDtype, torch::kFloat16},
    {"torch.bfloat16", Global::kDtype, torch::kBFloat16},
    {"torch.int64", Global::kDtype, torch::kInt64},
    {"torch.int32", Global::kDtype, torch::kInt32},
    {"torch.uint8", Global::kDtype, torch::kUInt8},
    {"torch.bool", Global::kDtype, torch::kBool},
    // DeepSpeed's loss scalers (their attributes), its ZeRO stage enum (its value) and a fragment's address.
    {"deepspeed.runtime.fp16.loss_scaler.LossScaler", Global::kDataClass, kNoDtype},
    {"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", Global::kDataClass, kNoDtype},
    {"deepspeed.runtime.zero.config.ZeroStageEnum", Global::kDataClass, kNoDtype},
    {"deepspeed.utils.tensor_fragment.fragment_address", Global::kDataClass, kNoDtype},
};

const AllowedGlobal* find_global(const std::string& name) {
  for (const auto& g : kAllowedGlobals) {
    if (name == g.name) return &g;
  }
  return nullptr;
}

class Unpickler {
 public:
  Unpickler(std::string path, caffe2::serialize::PyTorchStreamReader& archive, const char* data, size_t size)
      : path_(std::move(path)), archive_(archive), data_(data), size_(size) {}

  PyRef run() {
    while (true) {
      const auto op = static_cast<unsigned char>(read_byte());
      switch (op) {
        case 0x80: read_byte(); break;  // PROTO
        case 0x95: read_le(8); break;   // FRAME: a length hint
        case '.': {                     // STOP
          if (stack_.size() != 1) fail("ends with " + std::to_string(stack_.size()) + " values on its stack");
          return stack_.back();
        }
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case '0': pop(); break;                              // POP
        case '1': pop_mark(); break;                         // POP_MARK
        case 'N': push(py_none()); break;
        case 0x88: push(py_bool(true)); break;   // NEWTRUE
        case 0x89: push(py_bool(false)); break;  // NEWFALSE
        case 'J': push(py_int(static_cast<int32_t>(read_le(4)))); break;  // BININT
        case 'K': push(py_int(static_cast<int64_t>(read_le(1)))); break;  // BININT1
        case 'M': push(py_int(static_cast<int64_t>(read_le(2)))); break;  // BININT2
        case 0x8a: push(py_int(read_long(static_cast<size_t>(read_le(1))))); break;  // LONG1
        case 'G': push(py_float(read_be_double())); break;                               // BINFLOAT
        case 'X': push_text(Kind::kString, read_le(4)); break;     // BINUNICODE
        case 0x8c: push_text(Kind::kString, read_le(1)); break;    // SHORT_BINUNICODE
        case 'T': push_text(Kind::kString, read_le(4)); break;     // BINSTRING (protocol-1 str)
        case 'U': push_text(Kind::kString, read_le(1)); break;     // SHORT_BINSTRING
        case 'B': push_text(Kind::kBytes, read_le(4)); break;      // BINBYTES
        case 'C': push_text(Kind::kBytes, read_le(1)); break;      // SHORT_BINBYTES
        case ')': push(make_value(Kind::kTuple)); break;                  // EMPTY_TUPLE
        case ']': push(make_value(Kind::kList)); break;                   // EMPTY_LIST
        case '}': push(make_value(Kind::kDict)); break;                   // EMPTY_DICT
        case 't': push_sequence(Kind::kTuple, pop_mark()); break;  // TUPLE
        case 'l': push_sequence(Kind::kList, pop_mark()); break;   // LIST
        case 0x85: push_sequence(Kind::kTuple, pop_n(1)); break;   // TUPLE1
        case 0x86: push_sequence(Kind::kTuple, pop_n(2)); break;   // TUPLE2
        case 0x87: push_sequence(Kind::kTuple, pop_n(3)); break;   // TUPLE3
        case 'd': {                                                 // DICT
          auto dict = make_value(Kind::kDict);
          set_items(*dict, pop_mark());
          push(dict);
          break;
        }
        case 'a': {  // APPEND
          auto value = pop();
          adopt(list_on_top("APPEND"), value);
          break;
        }
        case 'e': {  // APPENDS
          auto values = pop_mark();
          auto& list = list_on_top("APPENDS");
          for (auto& v : values) adopt(list, v);
          break;
        }
        case 's': {  // SETITEM
          auto value = pop();
          auto key = pop();
          adopt_entry(dict_on_top("SETITEM"), key, value);
          break;
        }
        case 'u': {  // SETITEMS
          auto pairs = pop_mark();
          set_items(dict_on_top("SETITEMS"), pairs);
          break;
        }
        case 'q': memoize(read_le(1)); break;                  // BINPUT
        case 'r': memoize(read_le(4)); break;                  // LONG_BINPUT
        case 0x94: memoize(memo_.size()); break;               // MEMOIZE
        case 'h': push(recall(read_le(1))); break;             // BINGET
        case 'j': push(recall(read_le(4))); break;             // LONG_BINGET
        case 'c': {                                            // GLOBAL "module\nname\n"
          auto module = read_line();
          auto name = read_line();
          push_global(module + "." + name);
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          auto name = pop();
          auto module = pop();
          push_global(module->as_string(path_) + "." + name->as_string(path_));
          break;
        }
        case 'R': {  // REDUCE
          auto args = pop();
          auto callable = pop();
          push(call(*callable, args));
          break;
        }
        case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
          auto args = pop();
          auto cls = pop();
          push(call(*cls, args));
          break;
        }
        case 'b': {  // BUILD: the object's __setstate__ / __dict__
          auto state = pop();
          auto& object = *top("BUILD");
          // A module's state_dict (an OrderedDict) carries its `_metadata` attribute this way: not data we read.
          if (object.kind == Kind::kDict) break;
          if (object.kind != Kind::kObject) fail("BUILD on a " + object.kind_name());
          if (object.state) fail("BUILD twice on one object");
          adopt_state(object, state);
          break;
        }
        case 'Q': push(load_storage(*pop())); break;  // BINPERSID: torch.save's storage reference
        default: {
          char hex[8];
          std::snprintf(hex, sizeof(hex), "0x%02x", op);
          fail(std::string("opcode ") + hex + " at byte " + std::to_string(pos_ - 1) +
               " is not one torch.save writes");
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(path_ + ": unreadable pickle: " + what);
  }

  char read_byte() {
    if (pos_ >= size_) fail("truncated");
    return data_[pos_++];
  }

  uint64_t read_le(size_t bytes) {
    if (pos_ + bytes > size_) fail("truncated");
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(data_[pos_ + i])) << (8 * i);
    pos_ += bytes;
    return v;
  }

  // LONG1's little-endian two's complement of `bytes` bytes.
  int64_t read_long(size_t bytes) {
    if (bytes > 8) fail("an integer of " + std::to_string(bytes) + " bytes (more than 64 bits)");
    if (bytes == 0) return 0;
    uint64_t v = read_le(bytes);
    if (bytes < 8 && (v >> (8 * bytes - 1)) & 1) v |= ~uint64_t{0} << (8 * bytes);  // sign-extend
    return static_cast<int64_t>(v);
  }

  double read_be_double() {
    if (pos_ + 8 > size_) fail("truncated");
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(data_[pos_ + i]);
    pos_ += 8;
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }

  std::string read_line() {
    const auto start = pos_;
    while (pos_ < size_ && data_[pos_] != '\n') ++pos_;
    if (pos_ >= size_) fail("truncated");
    return std::string(data_ + start, data_ + pos_++);
  }

  void push(PyRef v) { stack_.push_back(std::move(v)); }
  void push_text(Kind kind, uint64_t bytes) {
    if (pos_ + bytes > size_) fail("truncated");
    auto v = make_value(kind);
    v->text.assign(data_ + pos_, bytes);
    pos_ += bytes;
    push(v);
  }
  void push_sequence(Kind kind, std::vector<PyRef> items) {
    auto v = make_value(kind);
    for (auto& item : items) adopt(*v, std::move(item));
    push(v);
  }

  // Puts `child` into `parent` (its items; `entries` and `state` go through adopt_entry / adopt_state). A container
  // is sealed once inside another: changing it afterwards (how a pickle builds a structure that contains itself) is
  // refused, so every value is a finite tree of bounded depth — which is all DeepSpeed's files are.
  void adopt(PyValue& parent, PyRef child) {
    check_child(parent, *child);
    parent.items.push_back(std::move(child));
  }
  void adopt_entry(PyValue& parent, PyRef key, PyRef value) {
    check_child(parent, *key);
    check_child(parent, *value);
    parent.entries.emplace_back(std::move(key), std::move(value));
  }
  void adopt_state(PyValue& parent, PyRef state) {
    check_child(parent, *state);
    parent.state = std::move(state);
  }
  void check_child(PyValue& parent, PyValue& child) {
    if (parent.sealed) fail("changes a container already placed in another (a structure that contains itself?)");
    if (&parent == &child) fail("puts a container into itself");
    child.sealed = true;
    parent.depth = std::max(parent.depth, child.depth + 1);
    if (parent.depth > kMaxNesting) fail("nests containers more than " + std::to_string(kMaxNesting) + " deep");
  }

  PyRef pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) fail("pops an empty stack");
    auto v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::vector<PyRef> pop_n(size_t n) {
    const size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() < floor + n) fail("pops an empty stack");
    std::vector<PyRef> out(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return out;
  }
  std::vector<PyRef> pop_mark() {
    if (marks_.empty()) fail("no MARK to pop to");
    const auto mark = marks_.back();
    marks_.pop_back();
    if (mark > stack_.size()) fail("a MARK above the stack");
    std::vector<PyRef> out(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return out;
  }
  const PyRef& top(const char* op) const {
    if (stack_.empty()) fail(std::string(op) + " on an empty stack");
    return stack_.back();
  }
  PyValue& list_on_top(const char* op) const {
    auto& v = *top(op);
    if (v.kind != Kind::kList) fail(std::string(op) + " to a " + v.kind_name());
    return v;
  }
  PyValue& dict_on_top(const char* op) const {
    auto& v = *top(op);
    if (v.kind != Kind::kDict) fail(std::string(op) + " to a " + v.kind_name());
    return v;
  }
  void set_items(PyValue& dict, const std::vector<PyRef>& pairs) {
    if (pairs.size() % 2) fail("a dict with an odd number of keys and values");
    for (size_t i = 0; i < pairs.size(); i += 2) adopt_entry(dict, pairs[i], pairs[i + 1]);
  }

  void memoize(uint64_t index) { memo_[index] = top("PUT"); }
  PyRef recall(uint64_t index) const {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail("GET of memo " + std::to_string(index) + ", never PUT");
    return it->second;
  }

  void push_global(const std::string& name) {
    const auto* allowed = find_global(name);
    if (!allowed) {
      throw std::runtime_error(path_ + ": holds a pickled '" + name +
                               "', which is not a tensor, a plain container or one of the few DeepSpeed objects "
                               "known to be data (src/checkpoint/torch_pickle.cpp); refused, nothing was executed");
    }
    auto v = make_value(Kind::kGlobal);
    v->text = name;
    push(v);
  }

  static const AllowedGlobal& global_of(const PyValue& v) { return *find_global(v.text); }

  // REDUCE and NEWOBJ: what calling an allowed global with `args` gives.
  PyRef call(const PyValue& callable, const PyRef& args) {
    if (callable.kind != Kind::kGlobal) fail("calls a " + callable.kind_name());
    const auto& a = args->as_sequence(path_ + ": arguments of " + callable.text);
    const auto& g = global_of(callable);
    switch (g.what) {
      case Global::kOrderedDict:
        if (!a.empty()) fail("OrderedDict built from arguments");
        return make_value(Kind::kDict);
      case Global::kRebuildTensor: return rebuild_tensor(a);
      case Global::kRebuildParameter:
        if (a.empty() || a[0]->kind != Kind::kTensor) fail("_rebuild_parameter without a tensor");
        return a[0];
      case Global::kRebuildFromType: {
        if (a.size() != 4 || a[0]->kind != Kind::kGlobal || a[1]->kind != Kind::kGlobal ||
            global_of(*a[1]).what != Global::kTensorType || a[2]->kind != Kind::kTuple ||
            (global_of(*a[0]).what != Global::kRebuildTensor && global_of(*a[0]).what != Global::kRebuildParameter)) {
          fail("_rebuild_from_type_v2 of anything but a torch.Tensor rebuilt from its storage");
        }
        const auto rebuilt = call(*a[0], a[2]);
        if (rebuilt->kind != Kind::kTensor) fail("_rebuild_from_type_v2 that does not rebuild a tensor");
        return rebuilt;
      }
      case Global::kSize: {
        if (a.size() != 1) fail("torch.Size of " + std::to_string(a.size()) + " arguments");
        auto t = make_value(Kind::kTuple);
        for (const auto& d : a[0]->as_sequence(path_ + ": torch.Size")) adopt(*t, py_int(d->as_int(path_)));
        return t;
      }
      case Global::kEncode: {
        // Protocol 2 writes bytes as _codecs.encode(their latin-1 decoding as a str, "latin1"): re-encode.
        if (a.size() != 2 || a[1]->as_string(path_) != "latin1") fail("_codecs.encode other than latin1");
        const auto& utf8 = a[0]->as_string(path_);
        auto out = make_value(Kind::kBytes);
        for (size_t i = 0; i < utf8.size(); ++i) {
          const auto c = static_cast<unsigned char>(utf8[i]);
          if (c < 0x80) {
            out->text.push_back(static_cast<char>(c));
          } else if ((c & 0xE0) == 0xC0 && i + 1 < utf8.size()) {
            out->text.push_back(static_cast<char>(((c & 0x1F) << 6) | (static_cast<unsigned char>(utf8[++i]) & 0x3F)));
          } else {
            fail("_codecs.encode of a character outside latin-1");
          }
        }
        return out;
      }
      case Global::kDataClass: {
        auto object = make_value(Kind::kObject);
        object->text = callable.text;
        for (const auto& arg : a) adopt(*object, arg);
        return object;
      }
      case Global::kStorageType:
      case Global::kTensorType:
      case Global::kDtype: fail("calls " + callable.text);
    }
    fail("calls " + callable.text);
  }

  // BINPERSID ('storage', storage type, key, location, numel): the record data/<key>, read once and shared by every
  // tensor that views it.
  PyRef load_storage(const PyValue& pid) {
    const auto& t = pid.as_sequence(path_ + ": persistent id");
    if (t.size() < 5 || t[0]->as_string(path_) != "storage" || t[1]->kind != Kind::kGlobal ||
        global_of(*t[1]).what != Global::kStorageType) {
      fail("a persistent id that is not a torch storage");
    }
    const auto dtype = global_of(*t[1]).dtype;
    const auto& key = t[2]->as_string(path_ + ": storage key");
    const auto numel = t[4]->as_int(path_ + ": storage size");
    auto& storage = storages_[key];
    if (!storage.defined()) {
      const std::string record = "data/" + key;
      if (!archive_.hasRecord(record)) fail("no record " + record + " for a storage it names");
      // The record's size is checked before anything is allocated: a crafted numel cannot ask for more memory
      // than the file holds.
      uint64_t bytes = 0;
      if (numel < 0 || __builtin_mul_overflow(static_cast<uint64_t>(numel), c10::elementSize(dtype), &bytes) ||
          archive_.getRecordSize(record) != bytes) {
        fail("record " + record + " holds " + std::to_string(archive_.getRecordSize(record)) + " bytes, its " +
             "storage " + std::to_string(numel) + " elements of " + std::to_string(c10::elementSize(dtype)));
      }
      storage = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
      if (bytes) archive_.getRecord(record, storage.data_ptr(), bytes);
    }
    auto v = make_value(Kind::kTensor);
    v->tensor = storage;
    return v;
  }

  PyRef rebuild_tensor(const std::vector<PyRef>& a) {
    if (a.size() < 4 || a[0]->kind != Kind::kTensor) fail("_rebuild_tensor_v2 without a storage");
    const auto& storage = a[0]->tensor;
    const auto offset = a[1]->as_int(path_ + ": storage offset");
    std::vector<int64_t> size, stride;
    for (const auto& s : a[2]->as_sequence(path_ + ": tensor size")) size.push_back(s->as_int(path_));
    for (const auto& s : a[3]->as_sequence(path_ + ": tensor stride")) stride.push_back(s->as_int(path_));
    if (size.size() != stride.size()) fail("a tensor whose size and stride differ in length");
    // The view must lie inside its storage and hold no more elements than it (no stride-0 expansion): whatever a
    // later copy of it allocates is bounded by the file. Overflow-checked: the numbers are the file's.
    int64_t last = offset, elements = 1;  // the furthest element the view reaches; how many it has
    bool empty = false;
    for (size_t i = 0; i < size.size(); ++i) {
      if (size[i] < 0 || stride[i] < 0) fail("a tensor with a negative size or stride");
      empty = empty || size[i] == 0;
      int64_t reach = 0;
      if (__builtin_mul_overflow(size[i] == 0 ? 0 : size[i] - 1, stride[i], &reach) ||
          __builtin_add_overflow(last, reach, &last) || __builtin_mul_overflow(elements, size[i], &elements)) {
        fail("a tensor whose size overflows");
      }
    }
    if (offset < 0 || (!empty && (last >= storage.numel() || elements > storage.numel()))) {
      fail("a tensor outside its storage, or larger than it");
    }
    auto v = make_value(Kind::kTensor);
    v->tensor = storage.as_strided(size, stride, offset);
    return v;
  }

  std::string path_;
  caffe2::serialize::PyTorchStreamReader& archive_;
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, PyRef> memo_;
  std::map<std::string, torch::Tensor> storages_;
};

}  // namespace

// A key set twice keeps its last value, as in Python.
const PyValue* PyValue::find(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (it->first->kind == Kind::kString && it->first->text == key) return it->second.get();
  }
  return nullptr;
}

const PyValue* PyValue::find(int64_t key) const {
  if (kind != Kind::kDict) return nullptr;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (it->first->kind == Kind::kInt && it->first->integer == key) return it->second.get();
  }
  return nullptr;
}

const PyValue& PyValue::at(const std::string& key, const std::string& where) const {
  const auto* v = find(key);
  if (!v) throw std::runtime_error(where + ": has no '" + key + "' (a " + kind_name() + ")");
  return *v;
}

const PyValue* PyValue::attribute(const std::string& name) const {
  return kind == Kind::kObject && state ? state->find(name) : nullptr;
}

namespace {
[[noreturn]] void wrong_kind(const std::string& where, const char* wanted, const PyValue& v) {
  throw std::runtime_error(where + ": expected " + wanted + ", found " + v.kind_name());
}
}  // namespace

int64_t PyValue::as_int(const std::string& where) const {
  if (kind == Kind::kInt) return integer;
  if (kind == Kind::kBool) return boolean ? 1 : 0;
  wrong_kind(where, "an int", *this);
}

double PyValue::as_double(const std::string& where) const {
  if (kind == Kind::kFloat) return real;
  if (kind == Kind::kInt) return static_cast<double>(integer);
  wrong_kind(where, "a float", *this);
}

bool PyValue::as_bool(const std::string& where) const {
  if (kind == Kind::kBool) return boolean;
  wrong_kind(where, "a bool", *this);
}

const std::string& PyValue::as_string(const std::string& where) const {
  if (kind == Kind::kString) return text;
  wrong_kind(where, "a str", *this);
}

const torch::Tensor& PyValue::as_tensor(const std::string& where) const {
  if (kind == Kind::kTensor) return tensor;
  wrong_kind(where, "a tensor", *this);
}

const std::vector<PyRef>& PyValue::as_sequence(const std::string& where) const {
  if (kind == Kind::kList || kind == Kind::kTuple) return items;
  wrong_kind(where, "a list or tuple", *this);
}

std::string PyValue::kind_name() const {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kTensor: return "tensor";
    case Kind::kObject:
    case Kind::kGlobal: return text;
  }
  return "?";
}

PyRef load_torch_file(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader archive(path);
    if (archive.hasRecord("byteorder")) {
      const auto [order, size] = archive.getRecord("byteorder");
      if (std::string(static_cast<const char*>(order.get()), size) != "little") {
        throw std::runtime_error(path + ": written on a big-endian machine, which is not supported");
      }
    }
    if (!archive.hasRecord("data.pkl")) throw std::runtime_error(path + ": a zip without data.pkl: not a torch.save file");
    const auto [data, size] = archive.getRecord("data.pkl");
    return Unpickler(path, archive, static_cast<const char*>(data.get()), size).run();
  } catch (const c10::Error& e) {
    // The zip reader's own errors: a missing file, a truncated or non-zip one (torch.save before 1.6, or not torch's).
    throw std::runtime_error(path + ": not a readable torch.save file (zip format, torch >= 1.6): " +
                             e.what_without_backtrace());
  }
}

const char* torch_storage_type(c10::ScalarType dtype) {
  for (const auto& g : kAllowedGlobals) {
    if (g.what == Global::kStorageType && g.dtype == dtype) return g.name;
  }
  throw std::runtime_error(std::string("no torch storage type for ") + c10::toString(dtype));
}

}  // namespace dscpp
