// Writing torch.save files (see torch_pickle.h): the builders of values to write, and a pickler of protocol 2 into
// torch's zip archive — data.pkl beside one data/<key> record per tensor — which Python's torch.load reads.
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>

#include "dscpp/checkpoint/torch_pickle.h"
#include "torch_pickle_internal.h"

namespace dscpp {

using Kind = PyValue::Kind;

PyRef make_value(Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

PyRef py_int(int64_t value) {
  auto v = make_value(Kind::kInt);
  v->integer = value;
  return v;
}

PyRef py_none() { return make_value(Kind::kNone); }

PyRef py_bool(bool value) {
  auto v = make_value(Kind::kBool);
  v->boolean = value;
  return v;
}

PyRef py_float(double value) {
  auto v = make_value(Kind::kFloat);
  v->real = value;
  return v;
}

PyRef py_str(std::string value) {
  auto v = make_value(Kind::kString);
  v->text = std::move(value);
  return v;
}

PyRef py_list(std::vector<PyRef> items) {
  auto v = make_value(Kind::kList);
  v->items = std::move(items);
  return v;
}

PyRef py_tuple(std::vector<PyRef> items) {
  auto v = make_value(Kind::kTuple);
  v->items = std::move(items);
  return v;
}

PyRef py_dict(std::vector<std::pair<std::string, PyRef>> entries) {
  auto v = make_value(Kind::kDict);
  for (auto& [key, value] : entries) v->entries.emplace_back(py_str(key), std::move(value));
  return v;
}

PyRef py_tensor(torch::Tensor tensor) {
  auto v = make_value(Kind::kTensor);
  v->tensor = std::move(tensor);
  return v;
}

PyRef py_object(std::string qualified_class, std::vector<PyRef> args, PyRef state) {
  auto v = make_value(Kind::kObject);
  v->text = std::move(qualified_class);
  v->items = std::move(args);
  v->state = std::move(state);
  return v;
}

namespace {

class Pickler {
 public:
  explicit Pickler(std::string path) : path_(std::move(path)) {}

  std::string run(const PyValue& value) {
    out_ += "\x80\x02";  // PROTO 2
    write(value);
    out_ += '.';
    return out_;
  }

  // The tensors written, by storage key ("0", "1", ...): the archive's data/<key> records.
  const std::vector<torch::Tensor>& storages() const { return storages_; }

 private:
  void global(const std::string& qualified) {
    const auto dot = qualified.rfind('.');
    if (dot == std::string::npos) throw std::runtime_error(path_ + ": no module in the name '" + qualified + "'");
    out_ += 'c';
    out_ += qualified.substr(0, dot) + "\n" + qualified.substr(dot + 1) + "\n";
  }
  void str(const std::string& s) {
    out_ += 'X';
    put4(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xff));
    } else {
      out_ += "\x8a\x08";  // LONG1 of 8 bytes, two's complement
      for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
    }
  }
  void tuple(const std::vector<PyRef>& items) {
    if (items.empty()) {
      out_ += ')';
      return;
    }
    out_ += '(';
    for (const auto& item : items) write(*item);
    out_ += 't';
  }
  void ints(const c10::IntArrayRef values) {
    out_ += '(';
    for (auto v : values) integer(v);
    out_ += 't';
  }

  void put4(uint32_t n) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  }

  // A container or object met again is a reference to the first (LONG_BINGET of the memo), as Python's pickler
  // writes it: a value placed many times costs a few bytes each, and reads back as one object.
  void write(const PyValue& v) {
    const bool shared = v.kind == Kind::kList || v.kind == Kind::kTuple || v.kind == Kind::kDict ||
                        v.kind == Kind::kObject;
    if (shared) {
      const auto it = memo_.find(&v);
      if (it != memo_.end()) {
        out_ += 'j';
        put4(it->second);
        return;
      }
    }
    write_value(v);
    if (shared) {
      const auto id = static_cast<uint32_t>(memo_.size());
      memo_.emplace(&v, id);
      out_ += 'r';  // LONG_BINPUT, once the value is complete
      put4(id);
    }
  }

  void write_value(const PyValue& v) {
    switch (v.kind) {
      case Kind::kNone: out_ += 'N'; return;
      case Kind::kBool: out_ += v.boolean ? "\x88" : "\x89"; return;
      case Kind::kInt: integer(v.integer); return;
      case Kind::kFloat: {
        uint64_t bits;
        std::memcpy(&bits, &v.real, sizeof(bits));
        out_ += 'G';
        for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
        return;
      }
      case Kind::kString: str(v.text); return;
      case Kind::kList:
        out_ += ']';
        if (!v.items.empty()) {
          out_ += '(';
          for (const auto& item : v.items) write(*item);
          out_ += 'e';
        }
        return;
      case Kind::kTuple: tuple(v.items); return;
      case Kind::kDict:
        out_ += '}';
        if (!v.entries.empty()) {
          out_ += '(';
          for (const auto& [key, value] : v.entries) {
            write(*key);
            write(*value);
          }
          out_ += 'u';
        }
        return;
      case Kind::kTensor: {
        // _rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict()) over its own contiguous storage.
        const auto t = v.tensor.detach().to(torch::kCPU).contiguous();
        const auto key = std::to_string(storages_.size());
        storages_.push_back(t);
        global("torch._utils._rebuild_tensor_v2");
        out_ += "((";
        str("storage");
        global(torch_storage_type(t.scalar_type()));
        str(key);
        str("cpu");
        integer(t.numel());
        out_ += "tQ";  // the persistent id tuple, BINPERSID
        integer(0);
        ints(t.sizes());
        ints(t.strides());
        out_ += "\x89";
        global("collections.OrderedDict");
        out_ += ")R";
        out_ += "tR";
        return;
      }
      case Kind::kObject:
        global(v.text);
        tuple(v.items);
        if (v.state) {
          out_ += "\x81";  // NEWOBJ: cls.__new__(cls, *args), then its attributes
          write(*v.state);
          out_ += 'b';
        } else {
          out_ += 'R';
        }
        return;
      case Kind::kBytes:
      case Kind::kGlobal: break;
    }
    throw std::runtime_error(path_ + ": a " + v.kind_name() + " has no pickle form here");
  }

  std::string path_;
  std::string out_;
  std::vector<torch::Tensor> storages_;
  std::map<const PyValue*, uint32_t> memo_;
};

}  // namespace

void save_torch_file(const std::string& path, const PyValue& value) {
  Pickler pickler(path);
  const auto pickle = pickler.run(value);
  try {
    caffe2::serialize::PyTorchStreamWriter writer(path);
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    writer.writeRecord("byteorder", "little", 6);
    for (size_t i = 0; i < pickler.storages().size(); ++i) {
      const auto& t = pickler.storages()[i];
      writer.writeRecord("data/" + std::to_string(i), t.data_ptr(), t.numel() * t.element_size());
    }
    writer.writeEndOfFile();
  } catch (const c10::Error& e) {
    throw std::runtime_error(path + ": cannot write (" + e.what_without_backtrace() + ")");
  }
}

}  // namespace dscpp
