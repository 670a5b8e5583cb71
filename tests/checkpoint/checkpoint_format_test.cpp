// The checkpoint format without processes: safetensors checksums and damage, manifest validation, the directory
// protocol (tags, latest, staging), fragment arithmetic and byte sizes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "../common/error_of.h"
#include "../common/subprocess.h"
#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/checkpoint/checkpoint_reader.h"
#include "dscpp/checkpoint/consolidate.h"
#include "dscpp/checkpoint/manifest.h"
#include "dscpp/checkpoint/safetensors.h"
#include "dscpp/checkpoint/tensor_slice.h"
#include "dscpp/zero/flat_layout.h"

namespace dscpp::testing {
namespace {

namespace fs = std::filesystem;

TEST(Safetensors, ChecksumsMatchTheBytesWrittenAndDamageIsNamed) {
  const auto dir = temp_dir("safetensors_crc");
  const auto path = (dir / "a.safetensors").string();
  const auto a = torch::arange(1000, torch::kFloat32), b = torch::arange(10, torch::kInt64);
  SafetensorsWriter writer(path, {{"a", torch::kFloat32, {1000}}, {"b", torch::kInt64, {10}}});
  writer.write("b", b);  // any order
  writer.write("a", a);
  writer.close();
  EXPECT_EQ(writer.tensor_crc32("a"), crc32_of(a.data_ptr(), a.nbytes()));
  // The whole file's CRC, combined from its pieces without reading back, equals the CRC of the file's bytes.
  const auto bytes = read_text(path);
  EXPECT_EQ(writer.file_bytes(), static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(writer.file_crc32(), crc32_of(bytes.data(), static_cast<int64_t>(bytes.size())));

  SafetensorsReader reader(path);
  EXPECT_TRUE(torch::equal(reader.read("a", writer.tensor_crc32("a")), a));
  EXPECT_TRUE(torch::equal(reader.read("b"), b));

  // One flipped byte inside "a": the checked read names the file and the tensor.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(bytes.size() - 80 - 100));
    f.put('\x7f');
  }
  const auto corrupt = error_of([&] { SafetensorsReader(path).read("a", writer.tensor_crc32("a")); });
  EXPECT_NE(corrupt.find(path), std::string::npos) << corrupt;
  EXPECT_NE(corrupt.find("checksum mismatch in tensor 'a'"), std::string::npos) << corrupt;

  // Truncated: the reader refuses to open it, naming the file and how far the data should go.
  fs::resize_file(path, bytes.size() - 7);
  const auto truncated = error_of([&] { SafetensorsReader reader2(path); });
  EXPECT_NE(truncated.find(path + ": truncated"), std::string::npos) << truncated;
  fs::resize_file(path, 5);
  EXPECT_NE(error_of([&] { SafetensorsReader reader3(path); }).find("truncated"), std::string::npos);
}

TEST(Safetensors, AnUnclosedWriterLeavesNoFile) {
  const auto dir = temp_dir("safetensors_unclosed");
  const auto path = (dir / "a.safetensors").string();
  {
    SafetensorsWriter writer(path, {{"a", torch::kFloat32, {4}}});
    writer.write("a", torch::ones({4}));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(FlatLayoutFragments, EveryRanksFragmentsTileEveryParameterOnce) {
  const std::vector<FlatLayout::Param> params = {
      {"a", {7, 3}, false}, {"b", {5}, false}, {"c", {11, 2}, true}, {"d", {1}, false}};
  for (int world : {1, 2, 3, 4}) {
    const FlatLayout layout(params, world, 16);
    std::vector<std::vector<int64_t>> count(layout.slots().size());
    for (size_t i = 0; i < layout.slots().size(); ++i) count[i].assign(layout.slots()[i].numel, 0);
    for (int r = 0; r < world; ++r) {
      for (const auto& f : layout.shard_fragments(r)) {
        const auto& slot = layout.slots()[f.slot];
        EXPECT_EQ(f.flat_offset, slot.offset + f.param_begin);
        // Inside rank r's shard of the slot's group.
        const int64_t shard = layout.shard_offset(slot.group, r);
        EXPECT_GE(f.flat_offset, shard);
        EXPECT_LE(f.flat_offset + f.numel, shard + layout.groups()[slot.group].shard_numel);
        for (int64_t e = f.param_begin; e < f.param_begin + f.numel; ++e) ++count[f.slot][e];
      }
    }
    for (size_t i = 0; i < count.size(); ++i) {
      for (int64_t e = 0; e < static_cast<int64_t>(count[i].size()); ++e) {
        ASSERT_EQ(count[i][e], 1) << "world " << world << " param " << layout.slots()[i].name << " element " << e;
      }
    }
  }
}

Manifest two_rank_manifest() {
  Manifest m;
  m.tag = "t";
  m.world_size = 2;
  m.zero_stage = 2;
  m.compute_dtype = "fp32";
  m.optimizer = "AdamW";
  m.loss_scaler.type = "unit";
  m.params = {{"w", {4, 2}}, {"b", {3}}};
  m.files = {{0, shard_file_name(0), 10, 1, {{"w", 0, 6}}, {}}, {1, shard_file_name(1), 10, 2, {{"w", 6, 2}, {"b", 0, 3}}, {}}};
  return m;
}

TEST(Manifest, RoundTripsThroughJson) {
  auto m = two_rank_manifest();
  m.client_state = {{"epoch", 3}};
  m.files[1].tensor_crc32["master/b"] = 4000000000u;
  m.scheduler_position = 5;
  m.module_state = {{"bn.running_mean", {3}, torch::kFloat32, false}, {"emb.weight", {4, 2}, torch::kBFloat16, true}};
  const auto back = Manifest::from_json(m.to_json(), "x");
  EXPECT_EQ(back.to_json(), m.to_json());
  EXPECT_EQ(back.files[1].tensor_crc32.at("master/b"), 4000000000u);
  EXPECT_EQ(back.client_state["epoch"], 3);
  EXPECT_EQ(back.scheduler_position, 5);
  ASSERT_EQ(back.module_state.size(), 2u);
  EXPECT_TRUE(back.module_state[1].frozen);
  // A manifest written before module state was saved has none: loads keep the model's own buffers.
  auto older = m.to_json();
  older.erase("module_state");
  EXPECT_TRUE(Manifest::from_json(older, "x").module_state.empty());
}

TEST(Manifest, BadManifestsAreErrorsNamingTheFileAndWhatIsWrong) {
  const auto good = two_rank_manifest().to_json();
  auto expect_error = [&](nlohmann::json json, const std::string& fragment) {
    const auto what = error_of([&] { Manifest::from_json(json, "/ck/t/manifest.json"); });
    EXPECT_NE(what.find("/ck/t/manifest.json"), std::string::npos) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << "want '" << fragment << "' in: " << what;
  };
  auto j = good;
  j.erase("global_steps");
  expect_error(j, "missing key 'global_steps'");
  j = good;
  j["optimizer"]["step_count"] = "three";
  expect_error(j, "'optimizer.step_count' has the wrong type");
  j = good;
  j["format"] = "pickle";
  expect_error(j, "not a deepspeed.cpp checkpoint manifest");
  j = good;
  j["version"] = 99;
  expect_error(j, "format version 99");
  j = good;
  j["files"][1]["fragments"][0] = {"w", 6, 1};  // w's last element is in no file
  expect_error(j, "do not hold parameter 'w' exactly once");
  j = good;
  j["files"][0]["fragments"].push_back({"b", 1, 1});  // b's element 1 is in two files
  expect_error(j, "do not hold parameter 'b' exactly once");
  j = good;
  j["files"][1]["fragments"][1] = {"b", 0, 9223372036854775807LL};
  expect_error(j, "is outside the parameter");
  j = good;
  j["params"][0]["shape"] = {4611686018427387904LL, 4};
  expect_error(j, "impossible shape");
  j = good;
  j["files"][1]["fragments"][1] = {"nope", 0, 3};
  expect_error(j, "fragment of 'nope'");
  j = good;
  j["files"][0]["file"] = "../../etc/passwd";
  expect_error(j, "not a plain file name");
  j = good;
  j["world_size"] = 3;
  expect_error(j, "2 shard files for world_size 3");
}

TEST(TensorSlice, PartsTileTheWholeAndTakeAndPutAreInverse) {
  // Megatron's fused [q; k; v] rows over 2 ranks: rank 1 holds rows 2-3 of each block of 4.
  const auto qkv = TensorSlice::part({12, 3}, 0, 2, 1, 3);
  EXPECT_EQ(qkv.pieces, (std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {6, 2}, {10, 2}}));
  EXPECT_EQ(qkv.shape(), (std::vector<int64_t>{6, 3}));
  const auto whole = torch::arange(36, torch::kFloat32).view({12, 3});
  EXPECT_TRUE(torch::equal(qkv.take(whole).narrow(0, 2, 2), whole.narrow(0, 6, 2)));
  auto rebuilt = torch::zeros({12, 3});
  for (int r = 0; r < 2; ++r) {
    const auto part = TensorSlice::part({12, 3}, 0, 2, r, 3);
    part.put(part.take(whole), rebuilt);
  }
  EXPECT_TRUE(torch::equal(rebuilt, whole));
  // A row-parallel weight: columns.
  const auto columns = TensorSlice::part({2, 4}, 1, 2, 1);
  EXPECT_TRUE(torch::equal(columns.take(torch::arange(8, torch::kFloat32).view({2, 4})),
                           torch::tensor({{2.f, 3.f}, {6.f, 7.f}})));
  EXPECT_EQ(TensorSlice::from_json(qkv.to_json()), qkv);
  EXPECT_NE(error_of([] { TensorSlice::part({10, 3}, 0, 4, 0); }).find("(10) does not divide into 1 blocks of 4"),
            std::string::npos);
  auto outside = columns.to_json();
  outside["pieces"][0] = {3, 2};
  EXPECT_NE(error_of([&] { TensorSlice::from_json(outside); }).find("is outside dimension 1"), std::string::npos);
}

// Two tensor-parallel ranks' files, each holding its column slice of w (4, 6).
Manifest sliced_manifest() {
  Manifest m = two_rank_manifest();
  m.params = {{"w", {4, 6}}};
  for (int r = 0; r < 2; ++r) m.files[r].fragments = {{"w", 0, 12, TensorSlice::part({4, 6}, 1, 2, r)}};
  return m;
}

TEST(Manifest, SlicedFragmentsMustTileTheirSliceAndTheSlicesTheParameter) {
  const auto good = sliced_manifest().to_json();
  EXPECT_EQ(Manifest::from_json(good, "x").to_json(), good);
  auto j = good;
  j["files"][1]["fragments"][0] = {"w", 0, 8, TensorSlice::part({4, 6}, 1, 3, 1).to_json()};  // columns 2-3 twice
  EXPECT_NE(error_of([&] { Manifest::from_json(j, "x"); }).find("the slices do not tile dimension 1"),
            std::string::npos);
  j = good;
  j["files"][1]["fragments"][0][2] = 11;  // the slice's last element is in no file
  EXPECT_NE(error_of([&] { Manifest::from_json(j, "x"); }).find("a slice's fragments do not tile it"),
            std::string::npos);
  j = good;
  j["files"][1]["fragments"].push_back({"w", 0, 1});  // a whole fragment beside the slices
  EXPECT_NE(error_of([&] { Manifest::from_json(j, "x"); }).find("both whole fragments and slices"),
            std::string::npos);
}

// The reader assembles the writers' column slices into the whole parameter and gives any other reader its own part
// of it: the whole, a row slice (another layout), or the writer's own slice (read straight from its fragments).
TEST(CheckpointReader, AssemblesSlicesIntoTheWholeAndAnyOtherSlice) {
  const auto dir = temp_dir("sliced_reader");
  const auto whole = torch::arange(24, torch::kFloat32).view({4, 6});
  auto m = sliced_manifest();
  for (int r = 0; r < 2; ++r) {
    const auto local = m.files[r].fragments[0].slice->take(whole).view({-1});
    SafetensorsWriter writer((dir / shard_file_name(r)).string(), {{"master/w", torch::kFloat32, {12}}}, {});
    writer.write("master/w", local);
    writer.close();
    m.files[r].bytes = writer.file_bytes();
    m.files[r].crc32 = writer.file_crc32();
    m.files[r].tensor_crc32 = {{"master/w", writer.tensor_crc32("master/w")}};
  }
  std::ofstream(dir / kManifestFile) << m.to_json().dump();
  CheckpointReader reader(dir.string());
  auto all = torch::empty({24});
  reader.read_range(kMasterKind, "w", 0, all);
  EXPECT_TRUE(torch::equal(all, whole.view({-1})));
  const auto row = TensorSlice::part({4, 6}, 0, 4, 2);
  auto mine = torch::empty({6});
  reader.read_range(kMasterKind, "w", 0, mine, &row);
  EXPECT_TRUE(torch::equal(mine, whole[2]));
  const auto same = TensorSlice::part({4, 6}, 1, 2, 1);
  auto part = torch::empty({5});
  reader.read_range(kMasterKind, "w", 3, part, &same);
  EXPECT_TRUE(torch::equal(part, same.take(whole).view({-1}).narrow(0, 3, 5)));
}

// Damaged input is an error, never a crash. Random byte flips and truncations of a real shard file and of
// a manifest's text: each either still reads (the damage hit padding or a value) or throws std::runtime_error.
TEST(Fuzzed, DamagedShardsAndManifestsAreErrorsNeverCrashes) {
  const auto dir = temp_dir("fuzz");
  const auto path = (dir / "a.safetensors").string();
  {
    SafetensorsWriter writer(path, {{"master/w", torch::kFloat32, {8, 2}}, {"rng/cpu", torch::kUInt8, {40}}});
    writer.write("master/w", torch::randn({8, 2}));
    writer.write("rng/cpu", torch::zeros({40}, torch::kUInt8));
    writer.close();
  }
  const auto original = read_text(path);
  const auto manifest_text = two_rank_manifest().to_json().dump();
  std::mt19937 rng(5);
  int errors = 0;
  for (int trial = 0; trial < 400; ++trial) {
    auto bytes = original;
    auto text = manifest_text;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // Mostly the header, where parsing happens.
      bytes[rng() % std::min<size_t>(bytes.size(), 200)] = static_cast<char>(rng());
      text[rng() % text.size()] = static_cast<char>(rng() % 2 ? rng() : "0123456789[]{}\",-"[rng() % 16]);
    }
    if (trial % 5 == 0) bytes.resize(rng() % bytes.size());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      SafetensorsReader reader(path);
      for (const auto& t : reader.tensors()) reader.read(t.info.name);
    } catch (const std::runtime_error&) {
      ++errors;
    }
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      ++errors;  // not JSON at all: Manifest::read reports that as a CheckpointError naming the file
      continue;
    }
    try {
      Manifest::from_json(json, "m.json");
    } catch (const CheckpointError&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 400);  // the damage was seen, not silently accepted every time
}

TEST(CheckpointDir, TagsLatestAndStaging) {
  const auto dir = temp_dir("checkpoint_dir");
  const auto root = (dir / "ckpt").string();
  EXPECT_NE(error_of([&] { resolve_tag(root, ""); }).find("no such checkpoint directory"), std::string::npos);
  EXPECT_TRUE(holds_no_checkpoint(root));
  prepare_staging(root, "global_step2");
  write_file_durably(staging_dir(root, "global_step2") + "/manifest.json", "{}");
  // Not yet published: it is not a tag and `latest` does not exist.
  EXPECT_TRUE(list_tags(root).empty());
  EXPECT_NE(error_of([&] { resolve_tag(root, ""); }).find("latest: missing"), std::string::npos);
  EXPECT_TRUE(holds_no_checkpoint(root));  // a crashed first save leaves nothing to resume
  publish_staging(root, "global_step2");
  EXPECT_FALSE(holds_no_checkpoint(root));  // a tag without `latest`: not empty (loading it names the tag)
  write_latest(root, "global_step2");
  EXPECT_EQ(resolve_tag(root, ""), "global_step2");
  EXPECT_EQ(list_tags(root), std::vector<std::string>{"global_step2"});
  const auto missing = error_of([&] { resolve_tag(root, "global_step9"); });
  EXPECT_NE(missing.find("tag 'global_step9' does not exist (complete tags here: global_step2)"), std::string::npos)
      << missing;
  // Re-saving a tag replaces it whole.
  prepare_staging(root, "global_step2");
  write_file_durably(staging_dir(root, "global_step2") + "/manifest.json", "{\"new\": 1}");
  publish_staging(root, "global_step2");
  EXPECT_EQ(read_text(fs::path(root) / "global_step2" / "manifest.json"), "{\"new\": 1}");
  EXPECT_FALSE(fs::exists(staging_dir(root, "global_step2")));
  for (const std::string bad : {"", "a/b", ".hidden", "latest"}) {
    EXPECT_NE(error_of([&] { check_tag(bad); }).find("is not allowed"), std::string::npos) << bad;
  }
}

// Names from the command line, a `latest` file or a manifest stay inside the checkpoint directory: no "..", no '/',
// no links followed to elsewhere, no temporary file written through a link planted at its name.
TEST(CheckpointDir, NothingLeadsOutsideTheCheckpointDirectory) {
  const auto dir = temp_dir("checkpoint_dir_escape");
  const auto root = (dir / "ckpt").string();
  const std::vector<std::string> escapes = {"..", "../x", "/etc", "a/../../b", "tag\nother", std::string("t\0", 2)};
  for (const auto& bad : escapes) {
    EXPECT_NE(error_of([&] { check_tag(bad); }).find("is not allowed"), std::string::npos) << bad;
  }
  // A `latest` that names a path outside.
  fs::create_directories(root);
  std::ofstream(fs::path(root) / "latest") << "../outside\n";
  EXPECT_NE(error_of([&] { resolve_tag(root, ""); }).find("checkpoint tag '../outside' is not allowed"),
            std::string::npos);
  // A tag that is a link to a directory elsewhere.
  fs::create_directories(dir / "elsewhere");
  std::ofstream(dir / "elsewhere" / "manifest.json") << "{}";
  fs::create_directory_symlink(dir / "elsewhere", fs::path(root) / "global_step5");
  EXPECT_NE(error_of([&] { resolve_tag(root, "global_step5"); })
                .find("global_step5: tag 'global_step5' is a symbolic link; a checkpoint's tags must be directories "
                      "inside it"),
            std::string::npos);
  // A link planted at the temporary name `latest` is written through: the file it points to stays as it was.
  std::ofstream(dir / "victim") << "precious";
  fs::create_symlink(dir / "victim", fs::path(root) / ("latest.tmp." + std::to_string(::getpid())));
  write_latest(root, "global_step2");
  EXPECT_EQ(read_text(dir / "victim"), "precious");
  EXPECT_EQ(read_text(fs::path(root) / "latest"), "global_step2\n");
}

// A first save marks the directory with an empty `latest` before it publishes: killed between publishing its tag and
// naming it, it leaves a directory that still holds no checkpoint (a restart starts fresh), not a damaged one.
TEST(CheckpointDir, AFirstSaveKilledAfterPublishingLeavesNoCheckpoint) {
  const auto root = (temp_dir("checkpoint_dir_first") / "ckpt").string();
  prepare_staging(root, "global_step2");
  mark_first_save(root);
  EXPECT_EQ(read_text(fs::path(root) / "latest"), "");
  write_file_durably(staging_dir(root, "global_step2") + "/manifest.json", "{}");
  publish_staging(root, "global_step2");  // ... and killed here
  EXPECT_TRUE(holds_no_checkpoint(root));
  const auto error = error_of([&] { resolve_tag(root, ""); });
  EXPECT_NE(error.find("latest: names no tag yet (the first save into this directory did not finish); pass a tag "
                       "(complete tags here: global_step2)"), std::string::npos) << error;
  EXPECT_EQ(resolve_tag(root, "global_step2"), "global_step2");  // the tag itself is whole
  // The save that finishes names its tag; later saves never empty `latest` again.
  write_latest(root, "global_step2");
  mark_first_save(root);
  EXPECT_EQ(read_text(fs::path(root) / "latest"), "global_step2\n");
  EXPECT_FALSE(holds_no_checkpoint(root));
  // A directory whose `latest` went missing stays damaged: no mark makes it look empty.
  fs::remove(fs::path(root) / "latest");
  mark_first_save(root);
  EXPECT_FALSE(fs::exists(fs::path(root) / "latest"));
  EXPECT_FALSE(holds_no_checkpoint(root));
}

TEST(ByteSize, ParsesHfStyleSizesAndRejectsOthers) {
  EXPECT_EQ(parse_byte_size("5GB"), 5'000'000'000);
  EXPECT_EQ(parse_byte_size("500MB"), 500'000'000);
  EXPECT_EQ(parse_byte_size("2GiB"), 2LL << 30);
  EXPECT_EQ(parse_byte_size("1.5kb"), 1500);
  EXPECT_EQ(parse_byte_size("123"), 123);
  for (const std::string bad : {"", "GB", "-1GB", "0", "5XB", "1e3", "1.2.3GB", "99999999999GB"}) {
    EXPECT_NE(error_of([&] { parse_byte_size(bad); }).find("expected a positive number"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace dscpp::testing
