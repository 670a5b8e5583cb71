// The torch.save reader (dscpp/checkpoint/torch_pickle.h) on archives built here, opcode by opcode: the values and
// containers Python's pickler writes, a tensor viewing a storage record, and the refusals — a name outside the
// allowed list (named, nothing run), a view past its storage, a truncated pickle, a file that is not a torch.save zip.
// Real DeepSpeed files are read in tests/conformance/test_deepspeed_checkpoints.py.
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "dscpp/checkpoint/torch_pickle.h"

namespace fs = std::filesystem;

namespace dscpp {
namespace {

// A pickle built opcode by opcode.
struct Pickle {
  std::string bytes = "\x80\x02";  // PROTO 2, as torch.save writes
  Pickle& op(char c) {
    bytes.push_back(c);
    return *this;
  }
  Pickle& raw(const std::string& s) {
    bytes += s;
    return *this;
  }
  Pickle& str(const std::string& s) {  // BINUNICODE
    op('X');
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((s.size() >> (8 * i)) & 0xff));
    return raw(s);
  }
  Pickle& small(int v) { return op('K').op(static_cast<char>(v)); }  // BININT1
  Pickle& global(const std::string& module, const std::string& name) { return op('c').raw(module + "\n" + name + "\n"); }
};

// Writes a torch.save-style archive (`data.pkl` and the storage records) and returns its path.
std::string archive(const std::string& name, const std::string& pickle,
                    const std::vector<std::pair<std::string, std::string>>& records = {}) {
  const auto path = (fs::temp_directory_path() / ("dscpp_torch_pickle_" + name + ".pt")).string();
  caffe2::serialize::PyTorchStreamWriter writer(path);
  writer.writeRecord("byteorder", "little", 6);
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  for (const auto& [record, data] : records) writer.writeRecord(record, data.data(), data.size());
  writer.writeEndOfFile();
  return path;
}

std::string load_error(const std::string& path) {
  try {
    load_torch_file(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(TorchPickle, ReadsPlainValuesAndSharedContainers) {
  Pickle p;
  p.op('}').op('(');                                             // {  (MARK for SETITEMS)
  p.str("neg").op('\x8a').op(6).raw(std::string("\x00\x00\x00\x00\x00\xff", 6));  // LONG1: -2^40
  p.str("half").op('G').raw(std::string("\x3f\xf8\x00\x00\x00\x00\x00\x00", 8));  // BINFLOAT 1.5 (big-endian)
  p.str("pair").op('\x88').op('N').op('\x86');                  // (True, None)
  p.str("list").op(']').op('q').op(7).op('(').small(1).small(2).op('e');  // [1, 2], memoized as 7
  p.str("again").op('h').op(7);                                  // the same list, from the memo
  p.str("ordered").global("collections", "OrderedDict").op(')').op('R').str("k").str("v").op('s');
  p.op('u').op('.');
  const auto value = load_torch_file(archive("values", p.bytes));
  ASSERT_EQ(value->kind, PyValue::Kind::kDict);
  EXPECT_EQ(value->at("neg", "t").as_int("t"), -(int64_t{1} << 40));
  EXPECT_EQ(value->at("half", "t").as_double("t"), 1.5);
  const auto& pair = value->at("pair", "t").as_sequence("t");
  ASSERT_EQ(pair.size(), 2u);
  EXPECT_TRUE(pair[0]->as_bool("t"));
  EXPECT_TRUE(pair[1]->is_none());
  EXPECT_EQ(value->at("list", "t").as_sequence("t").size(), 2u);
  EXPECT_EQ(&value->at("list", "t"), &value->at("again", "t"));
  EXPECT_EQ(value->at("ordered", "t").at("k", "t").as_string("t"), "v");
  EXPECT_EQ(value->find("missing"), nullptr);
}

// _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks): a view of storage record data/0.
Pickle tensor_pickle(int rows, int cols) {
  Pickle p;
  p.global("torch._utils", "_rebuild_tensor_v2").op('(');
  p.op('(').str("storage").global("torch", "FloatStorage").str("0").str("cpu").small(6).op('t').op('Q');
  p.small(1).small(rows).small(cols).op('\x86').small(cols).small(1).op('\x86').op('\x89');
  p.global("collections", "OrderedDict").op(')').op('R').op('t').op('R').op('.');
  return p;
}

TEST(TorchPickle, ReadsATensorViewingItsStorageRecord) {
  const float storage[6] = {0, 1, 2, 3, 4, 5};
  const auto path = archive("tensor", tensor_pickle(2, 2).bytes,
                            {{"data/0", std::string(reinterpret_cast<const char*>(storage), sizeof(storage))}});
  const auto value = load_torch_file(path);
  const auto& t = value->as_tensor("t");
  EXPECT_TRUE(torch::equal(t, torch::tensor({{1.f, 2.f}, {3.f, 4.f}})));
}

TEST(TorchPickle, RefusesAViewPastItsStorage) {
  const float storage[6] = {};
  const auto path = archive("past", tensor_pickle(3, 3).bytes,
                            {{"data/0", std::string(reinterpret_cast<const char*>(storage), sizeof(storage))}});
  EXPECT_NE(load_error(path).find("a tensor outside its storage"), std::string::npos) << load_error(path);
}

TEST(TorchPickle, RefusesAStorageRecordOfAnotherSize) {
  const float storage[5] = {};
  const auto path = archive("short_record", tensor_pickle(2, 2).bytes,
                            {{"data/0", std::string(reinterpret_cast<const char*>(storage), sizeof(storage))}});
  EXPECT_NE(load_error(path).find("record data/0 holds 20 bytes, its storage 6 elements of 4"), std::string::npos)
      << load_error(path);
}

TEST(TorchPickle, RefusesAnExpandedViewThatCouldAskForMoreMemoryThanTheFileHolds) {
  // size (4, 4) with stride (0, 0): 16 elements from a storage of 6 (a copy would allocate what the file never held).
  Pickle p;
  p.global("torch._utils", "_rebuild_tensor_v2").op('(');
  p.op('(').str("storage").global("torch", "FloatStorage").str("0").str("cpu").small(6).op('t').op('Q');
  p.small(0).small(4).small(4).op('\x86').small(0).small(0).op('\x86').op('\x89');
  p.global("collections", "OrderedDict").op(')').op('R').op('t').op('R').op('.');
  const float storage[6] = {};
  const auto path = archive("expanded", p.bytes,
                            {{"data/0", std::string(reinterpret_cast<const char*>(storage), sizeof(storage))}});
  EXPECT_NE(load_error(path).find("larger than it"), std::string::npos) << load_error(path);
}

TEST(TorchPickle, RefusesAStructureThatContainsItselfOrNestsWithoutBound) {
  Pickle self;  // L = []; L.append(L)
  self.op(']').op('q').op(0).op('h').op(0).op('a').op('.');
  EXPECT_NE(load_error(archive("self", self.bytes)).find("puts a container into itself"), std::string::npos);

  Pickle cycle;  // A = []; B = [A]; A.append(B)
  cycle.op(']').op('q').op(0).op(']').op('h').op(0).op('a').op('q').op(1).op('h').op(0).op('h').op(1).op('a');
  cycle.op('.');
  EXPECT_NE(load_error(archive("cycle", cycle.bytes)).find("changes a container already placed in another"),
            std::string::npos);

  Pickle deep;  // [[[[...]]]] 100,000 deep
  for (int i = 0; i < 100000; ++i) deep.op(']');
  for (int i = 0; i < 99999; ++i) deep.op('a');
  deep.op('.');
  EXPECT_NE(load_error(archive("deep", deep.bytes)).find("nests containers more than 256 deep"), std::string::npos);

  Pickle below_mark;  // TUPLE1 reaching below its MARK
  below_mark.small(1).op('(').op('\x85').op('.');
  EXPECT_NE(load_error(archive("below_mark", below_mark.bytes)).find("pops an empty stack"), std::string::npos);
}

TEST(TorchPickle, RefusesANameOutsideTheListWithoutCallingIt) {
  Pickle p;
  p.global("os", "system").str("touch /tmp/dscpp_should_not_exist").op('\x85').op('R').op('.');
  const auto path = archive("global", p.bytes);
  const auto error = load_error(path);
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("'os.system'"), std::string::npos) << error;
  EXPECT_NE(error.find("nothing was executed"), std::string::npos) << error;
}

TEST(TorchPickle, RefusesATruncatedPickleAndAFileThatIsNotAnArchive) {
  Pickle p;
  p.op('}').str("key");  // no value, no STOP
  EXPECT_NE(load_error(archive("truncated", p.bytes)).find("truncated"), std::string::npos);

  const auto path = (fs::temp_directory_path() / "dscpp_torch_pickle_not_zip.pt").string();
  std::ofstream(path) << "not a zip";
  const auto error = load_error(path);
  EXPECT_NE(error.find(path + ": not a readable torch.save file"), std::string::npos) << error;
  EXPECT_NE(load_error("/nonexistent/dscpp.pt").find("/nonexistent/dscpp.pt"), std::string::npos);
}

}  // namespace
}  // namespace dscpp
