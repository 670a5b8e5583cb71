// CpuMemoryTracker counts every byte while keeping the default CPU allocator's contract, on which LibTorch's
// raw_allocate / raw_deallocate depend (oneDNN's scratch memory for bf16 matmuls on AVX-512 CPUs comes through them).
// The tracker installs once per process; ctest runs each TEST in a process of its own.
#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <thread>
#include <vector>

#include "dscpp/monitor/memory_tracker.h"

namespace dscpp::testing {
namespace {

TEST(CpuMemoryTracker, RawAllocateAndDeallocateAreCountedExactly) {
  CpuMemoryTracker::install();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  const int64_t base = CpuMemoryTracker::allocated();
  // LibTorch asserts inside raw_allocate that the DataPtr's context is its data pointer.
  void* a = allocator->raw_allocate(1000);
  void* b = allocator->raw_allocate(3);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % c10::gAlignment, 0u);
  std::memset(a, 0x5a, 1000);
  EXPECT_EQ(CpuMemoryTracker::allocated(), base + 1003);
  EXPECT_GE(CpuMemoryTracker::peak(), base + 1003);
  allocator->raw_deallocate(a);
  EXPECT_EQ(CpuMemoryTracker::allocated(), base + 3);
  allocator->raw_deallocate(b);
  EXPECT_EQ(CpuMemoryTracker::allocated(), base);
}

// What the default CPU allocator promises and LibTorch relies on: a "simple" DataPtr (context == data) on the CPU,
// aligned as c10 aligns, whose deleter is raw_deleter().
TEST(CpuMemoryTracker, DataPtrsKeepTheDefaultAllocatorsContract) {
  c10::Allocator* original = c10::GetCPUAllocator();
  {
    const auto d = original->allocate(64);
    ASSERT_EQ(d.get(), d.get_context()) << "the default allocator itself gives simple DataPtrs";
    ASSERT_EQ(d.get_deleter(), original->raw_deleter());
  }
  CpuMemoryTracker::install();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  ASSERT_NE(allocator, original) << "install() puts the counting allocator in front";
  ASSERT_NE(allocator->raw_deleter(), nullptr);
  for (const size_t n : {size_t{1}, size_t{64}, size_t{4097}, size_t{1} << 22}) {
    const int64_t base = CpuMemoryTracker::allocated();
    {
      const auto d = allocator->allocate(n);
      EXPECT_EQ(d.get(), d.get_context()) << n << " bytes";
      EXPECT_EQ(d.get_deleter(), allocator->raw_deleter()) << n << " bytes";
      EXPECT_EQ(d.device(), c10::Device(c10::kCPU));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(d.get()) % c10::gAlignment, 0u) << n << " bytes";
      EXPECT_EQ(CpuMemoryTracker::allocated(), base + static_cast<int64_t>(n));
    }
    EXPECT_EQ(CpuMemoryTracker::allocated(), base) << n << " bytes";
  }
}

// Zero bytes: a null pointer that holds nothing, as the default allocator gives; freeing it is a no-op.
TEST(CpuMemoryTracker, ZeroBytesHoldNothing) {
  EXPECT_EQ(c10::GetCPUAllocator()->allocate(0).get(), nullptr);
  CpuMemoryTracker::install();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  const int64_t base = CpuMemoryTracker::allocated();
  {
    const auto d = allocator->allocate(0);
    EXPECT_EQ(d.get(), nullptr);
    EXPECT_EQ(d.get_deleter(), allocator->raw_deleter());
  }
  void* p = allocator->raw_allocate(0);
  EXPECT_EQ(p, nullptr);
  allocator->raw_deallocate(p);
  EXPECT_EQ(CpuMemoryTracker::allocated(), base);
}

TEST(CpuMemoryTracker, TensorsAreCountedUntilFreedAndThePeakIsKept) {
  CpuMemoryTracker::install();
  const int64_t base = CpuMemoryTracker::allocated();
  CpuMemoryTracker::reset_peak();
  {
    const auto t = torch::ones({1000}, torch::kFloat32);
    EXPECT_EQ(CpuMemoryTracker::allocated(), base + 4000);
    const auto u = t.to(torch::kBFloat16);
    EXPECT_EQ(CpuMemoryTracker::allocated(), base + 6000);
    const auto v = u.clone();
    EXPECT_EQ(CpuMemoryTracker::allocated(), base + 8000);
    EXPECT_TRUE(torch::equal(v, u));
  }
  EXPECT_EQ(CpuMemoryTracker::allocated(), base);
  EXPECT_EQ(CpuMemoryTracker::peak(), base + 8000);
  CpuMemoryTracker::reset_peak();
  EXPECT_EQ(CpuMemoryTracker::peak(), base);
}

// A pointer raw_allocate'd before install is raw_deallocate'd afterwards through the counting allocator (oneDNN can
// hold scratch that long): it goes back to the allocator that made it, and the count does not move.
TEST(CpuMemoryTracker, PointerRawAllocatedBeforeInstallIsFreedByItsOwnAllocator) {
  if (CpuMemoryTracker::installed()) GTEST_SKIP() << "needs a process of its own (ctest gives each test one)";
  void* early = c10::GetCPUAllocator()->raw_allocate(256);
  std::memset(early, 1, 256);
  CpuMemoryTracker::install();
  const int64_t base = CpuMemoryTracker::allocated();
  c10::GetCPUAllocator()->raw_deallocate(early);
  EXPECT_EQ(CpuMemoryTracker::allocated(), base);
}

// The path that aborted on AVX-512 CPUs: LibTorch's bf16 matmuls (oneDNN's where the CPU has AVX-512 BW/VL/DQ,
// ATen's own loop elsewhere) under the tracker give the same bits as without it, and give back every byte.
TEST(CpuMemoryTracker, Bf16MatmulsUnderTheTrackerAreExactAndGiveEveryByteBack) {
  torch::manual_seed(0);
  const auto x = torch::randn({4, 64, 256}).to(torch::kBFloat16);
  const auto w = torch::randn({512, 256}).to(torch::kBFloat16);
  const auto b = torch::randn({512}).to(torch::kBFloat16);
  const auto want_linear = torch::linear(x, w, b);
  const auto want_bmm = torch::bmm(x, x.transpose(1, 2));
  CpuMemoryTracker::install();
  const int64_t base = CpuMemoryTracker::allocated();
  {
    const auto linear = torch::linear(x, w, b);
    const auto bmm = torch::bmm(x, x.transpose(1, 2));
    EXPECT_TRUE(torch::equal(linear, want_linear));
    EXPECT_TRUE(torch::equal(bmm, want_bmm));
    EXPECT_EQ(CpuMemoryTracker::allocated(), base + static_cast<int64_t>(linear.nbytes() + bmm.nbytes()));
  }
  EXPECT_EQ(CpuMemoryTracker::allocated(), base);
}

// Gloo's threads, OpenMP workers and the main thread allocate at once.
TEST(CpuMemoryTracker, ConcurrentAllocationsBalance) {
  CpuMemoryTracker::install();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  const int64_t base = CpuMemoryTracker::allocated();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([allocator, t] {
      std::vector<c10::DataPtr> held;
      for (int i = 0; i < 20000; ++i) {
        if (i % 3 == 2) {
          allocator->raw_deallocate(allocator->raw_allocate(static_cast<size_t>(8 + i % 97)));
        } else {
          held.push_back(allocator->allocate(static_cast<size_t>(1 + (i * 31 + t) % 4096)));
        }
        if (held.size() > 64) held.erase(held.begin(), held.begin() + 32);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(CpuMemoryTracker::allocated(), base);
  EXPECT_GT(CpuMemoryTracker::peak(), base);
}

// torch copies storages through Allocator::clone (copy-on-write materialisation among others).
TEST(CpuMemoryTracker, CloneCopiesAndIsCounted) {
  CpuMemoryTracker::install();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  const int64_t base = CpuMemoryTracker::allocated();
  const std::vector<char> source(300, 'x');
  {
    const auto copy = allocator->clone(source.data(), source.size());
    EXPECT_EQ(std::memcmp(copy.get(), source.data(), source.size()), 0);
    EXPECT_EQ(CpuMemoryTracker::allocated(), base + 300);
  }
  EXPECT_EQ(CpuMemoryTracker::allocated(), base);
}

}  // namespace
}  // namespace dscpp::testing
