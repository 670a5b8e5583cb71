// ZeRO-Infinity's swapping: AsyncIo moves whole buffers through io_uring and libaio exactly, and the NVMe store
// hands out sub-groups that hold what was last written to them, whatever the buffer count, with its file gone from
// nvme_path and clear errors for a bad path or a disk that cannot hold the state.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "../common/subprocess.h"
#include "dscpp/offload/async_io.h"
#include "dscpp/offload/nvme_store.h"

namespace dscpp {
// What ctest and a failure print for a backend: its name, not its bytes (found by argument-dependent lookup).
static void PrintTo(IoBackend backend, std::ostream* os) {
  *os << (backend == IoBackend::kIoUring ? "io_uring" : backend == IoBackend::kLibaio ? "libaio" : "auto");
}
}  // namespace dscpp

namespace dscpp::testing {
namespace {

namespace fs = std::filesystem;

struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes) : bytes(bytes) {
    if (posix_memalign(&data, kIoAlignment, bytes) != 0) throw std::bad_alloc();
  }
  ~AlignedBuffer() { free(data); }
  void* data = nullptr;
  size_t bytes;
};

class AsyncIoBackends : public ::testing::TestWithParam<IoBackend> {};

TEST_P(AsyncIoBackends, WritesAndReadsBackExactlyInBlocks) {
  AioConfig aio;
  aio.block_size = 1 << 20;
  aio.queue_depth = 3;
  AsyncIo io(aio, GetParam());
  EXPECT_EQ(io.backend(), GetParam() == IoBackend::kIoUring ? "io_uring" : "libaio");
  const auto dir = temp_dir("async_io");
  const auto path = (dir / "file").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  ASSERT_GE(fd, 0);
  const size_t bytes = (5 << 20) + 3 * kIoAlignment;  // 5 whole blocks and a partial one
  AlignedBuffer out(bytes), in(bytes);
  auto pattern = torch::from_blob(out.data, {static_cast<int64_t>(bytes / 4)}, torch::kInt32);
  pattern.copy_(torch::arange(static_cast<int64_t>(bytes / 4), torch::kInt32) * 7 + 1);
  // Two transfers queued at once: the second waits for queue slots, both complete.
  auto a = io.write(fd, out.data, bytes, 0, path);
  auto b = io.write(fd, out.data, kIoAlignment, static_cast<off_t>(bytes), path);
  io.wait(b);
  io.wait(a);
  std::memset(in.data, 0, bytes);
  io.wait(io.read(fd, in.data, bytes, 0, path));
  EXPECT_EQ(std::memcmp(in.data, out.data, bytes), 0);
  EXPECT_EQ(fs::file_size(path), bytes + kIoAlignment);

  // Reading past the end comes back short: an error naming the file, not silently stale bytes.
  try {
    io.wait(io.read(fd, in.data, 2 * kIoAlignment, static_cast<off_t>(bytes), path));
    FAIL() << "a short read must throw";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  // O_DIRECT's alignment is checked before anything reaches the kernel.
  EXPECT_THROW(io.read(fd, static_cast<char*>(in.data) + 1, kIoAlignment, 0, path), std::invalid_argument);
  EXPECT_THROW(io.read(fd, in.data, 100, 0, path), std::invalid_argument);
  ::close(fd);
}

// DeepSpeed's aio knobs act: single_submit hands each block over on its own, overlap_events false submits a batch
// and waits for all of it before the next, intra_op_parallelism runs that many I/O threads over the same transfers.
TEST_P(AsyncIoBackends, AioKnobsShapeTheSubmissions) {
  const auto dir = temp_dir("async_io_knobs");
  const auto path = (dir / "file").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  ASSERT_GE(fd, 0);
  constexpr size_t kBlock = 64 * 1024;
  constexpr size_t kBlocks = 8;
  AlignedBuffer out(kBlock * kBlocks), in(kBlock * kBlocks);
  auto pattern = torch::from_blob(out.data, {static_cast<int64_t>(kBlock * kBlocks / 4)}, torch::kInt32);
  pattern.copy_(torch::arange(pattern.numel(), torch::kInt32) * 3 - 5);
  auto round_trip = [&](const AioConfig& aio) {
    AsyncIo io(aio, GetParam());
    io.wait(io.write(fd, out.data, kBlock * kBlocks, 0, path));
    std::memset(in.data, 0, kBlock * kBlocks);
    io.wait(io.read(fd, in.data, kBlock * kBlocks, 0, path));
    EXPECT_EQ(std::memcmp(in.data, out.data, kBlock * kBlocks), 0);
    return io.stats();
  };
  AioConfig aio;
  aio.block_size = kBlock;
  aio.queue_depth = static_cast<int>(kBlocks);
  // Default: each transfer's blocks all fit the queue, so each goes to the kernel in one submission.
  auto batched = round_trip(aio);
  EXPECT_EQ(batched.blocks, 2 * static_cast<int64_t>(kBlocks));
  EXPECT_EQ(batched.submissions, 2);
  EXPECT_EQ(batched.threads, 1);
  aio.single_submit = true;
  auto single = round_trip(aio);
  EXPECT_EQ(single.submissions, single.blocks);
  aio.single_submit = false;
  aio.queue_depth = 3;
  aio.overlap_events = false;
  auto stepped = round_trip(aio);
  EXPECT_EQ(stepped.submissions, 2 * 3);  // ceil(8 / 3) batches per transfer, each waited for whole
  EXPECT_LE(stepped.max_in_kernel, 3);
  aio.overlap_events = true;
  aio.intra_op_parallelism = 3;
  auto parallel = round_trip(aio);
  EXPECT_EQ(parallel.threads, 3);
  EXPECT_EQ(parallel.blocks, 2 * static_cast<int64_t>(kBlocks));
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Kernel, AsyncIoBackends, ::testing::Values(IoBackend::kIoUring, IoBackend::kLibaio),
                         [](const auto& info) { return info.param == IoBackend::kIoUring ? "io_uring" : "libaio"; });

NvmeStoreOptions store_options(const fs::path& dir, int buffer_count) {
  NvmeStoreOptions o;
  o.nvme_path = dir.string();
  o.config_key = "zero_optimization.offload_optimizer.nvme_path";
  o.sub_group_sizes = uniform_sub_groups(100'003, 30'000);  // four sub-groups, the last 10,003 elements
  o.kinds = 3;
  o.buffer_count = buffer_count;
  o.aio.block_size = 64 * 1024;  // several blocks per sub-group
  o.initial_values = [](int i, const std::vector<torch::Tensor>& slices) {
    for (size_t k = 0; k < slices.size(); ++k) {
      slices[k].copy_(torch::arange(slices[k].numel(), torch::kFloat32) + 1e6 * static_cast<double>(k) + 1e5 * i);
    }
  };
  return o;
}

// What kind k holds at element e after `sweeps` passes that each add (k + 1) to every element.
torch::Tensor expected(int k, int sweeps, int64_t numel, int64_t sub_group) {
  auto e = torch::arange(numel, torch::kFloat64);
  auto i = torch::floor(e / static_cast<double>(sub_group));
  return (e - i * sub_group + 1e6 * k + 1e5 * i + sweeps * (k + 1)).to(torch::kFloat32);
}

class NvmeStoreBuffers : public ::testing::TestWithParam<int> {};

TEST_P(NvmeStoreBuffers, SubGroupsHoldWhatWasLastWritten) {
  const auto dir = temp_dir("nvme_store_" + std::to_string(GetParam()));
  auto store = make_nvme_store(store_options(dir, GetParam()));
  ASSERT_EQ(store->sub_groups(), 4);
  // The swap file is already unlinked: nothing is left under nvme_path, even if the process dies.
  EXPECT_TRUE(fs::is_empty(dir));
  for (int sweep = 1; sweep <= 3; ++sweep) {
    for (int i = 0; i < store->sub_groups(); ++i) {
      auto slices = store->acquire(i);
      ASSERT_EQ(slices.size(), 3u);
      for (int k = 0; k < 3; ++k) slices[k].add_(k + 1);
      store->release(i);
    }
    store->flush();
  }
  for (int k = 0; k < 3; ++k) {
    auto all = torch::empty({100'003});
    store->read(k, 0, all);
    EXPECT_TRUE(torch::equal(all, expected(k, 3, 100'003, 30'000))) << "kind " << k;
  }
  // Random-access writes that straddle sub-groups, then reads of ranges inside and across them.
  store->write({{1, 29'990, torch::full({20}, -1.0f)}, {2, 0, torch::full({3}, -2.0f)}, {0, 100'000, torch::full({3}, -3.0f)}});
  auto across = torch::empty({40});
  store->read(1, 29'980, across);
  auto want = expected(1, 3, 100'003, 30'000).narrow(0, 29'980, 40).clone();
  want.narrow(0, 10, 20).fill_(-1.0f);
  EXPECT_TRUE(torch::equal(across, want));
  auto tail = torch::empty({3});
  store->read(0, 100'000, tail);
  EXPECT_TRUE(torch::equal(tail, torch::full({3}, -3.0f)));
  store.reset();
  EXPECT_TRUE(fs::is_empty(dir));
}

INSTANTIATE_TEST_SUITE_P(BufferCount, NvmeStoreBuffers, ::testing::Values(1, 2, 4));

// ZeRO-3's parameter store: one sub-group per group shard (uneven sizes, an empty one), 16-bit elements, no
// automatic read-ahead but explicit prefetches in a non-sequential order, with fewer buffers than sub-groups.
TEST(NvmeStore, UnevenBf16SubGroupsInAnyOrderWithExplicitPrefetch) {
  const auto dir = temp_dir("nvme_params");
  NvmeStoreOptions o;
  o.nvme_path = dir.string();
  o.config_key = "zero_optimization.offload_param.nvme_path";
  o.role = "param";
  o.sub_group_sizes = {5'000, 0, 17, 70'001, 2'048};
  o.dtype = torch::kBFloat16;
  o.buffer_count = 2;
  o.read_ahead = false;
  o.initial_values = [](int i, const std::vector<torch::Tensor>& slices) { slices[0].fill_(i + 0.5); };
  auto store = make_nvme_store(o);
  ASSERT_EQ(store->sub_groups(), 5);
  EXPECT_EQ(store->numel(), 5'000 + 17 + 70'001 + 2'048);
  for (int round = 1; round <= 2; ++round) {
    for (int i : {3, 0, 4, 2, 1}) {
      store->prefetch((i + 2) % 5);
      auto slice = store->acquire(i).front();
      ASSERT_EQ(slice.scalar_type(), torch::kBFloat16);
      ASSERT_EQ(slice.numel(), o.sub_group_sizes[i]);
      if (slice.numel() > 0) {
        EXPECT_EQ(slice[0].item<float>(), i + 0.5f + 10.0f * (round - 1)) << "sub-group " << i << " round " << round;
      }
      slice.add_(10.0);
      store->release(i);
    }
    store->flush();
  }
  auto all = torch::empty({store->numel()}, torch::kBFloat16);
  store->read(0, 0, all);
  EXPECT_EQ(all[0].item<float>(), 20.5f);
  EXPECT_EQ(all[5'000].item<float>(), 22.5f);          // sub-group 2 (sub-group 1 is empty)
  EXPECT_EQ(all[store->numel() - 1].item<float>(), 24.5f);
}

TEST(NvmeStore, ANonDirectoryPathNamesTheKeyAndThePath) {
  const auto dir = temp_dir("nvme_bad_path");
  std::ofstream(dir / "file") << "x";
  auto o = store_options(dir / "file" / "swap", 4);
  try {
    make_nvme_store(o);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("zero_optimization.offload_optimizer.nvme_path"), std::string::npos) << what;
    EXPECT_NE(what.find((dir / "file" / "swap").string()), std::string::npos) << what;
  }
}

// The file system refuses to grow the file (here through RLIMIT_FSIZE, the same refusal a full disk gives with
// ENOSPC): an error at creation naming the path, the size needed and what is free, and nothing left behind.
TEST(NvmeStore, SpaceThatCannotBeReservedIsAClearErrorAtCreation) {
  const auto dir = temp_dir("nvme_full");
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = before;
  small.rlim_cur = 256 * 1024;  // the store needs ~1.2 MB
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string what;
  try {
    make_nvme_store(store_options(dir, 4));
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(what.empty()) << "expected an error";
  EXPECT_NE(what.find("cannot reserve"), std::string::npos) << what;
  EXPECT_NE(what.find(dir.string()), std::string::npos) << what;
  EXPECT_NE(what.find("free"), std::string::npos) << what;
  EXPECT_TRUE(fs::is_empty(dir));
}

}  // namespace
}  // namespace dscpp::testing
