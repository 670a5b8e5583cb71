// cpu_peak_from_cpuinfo: the vector-unit model applied to /proc/cpuinfo texts of the machine kinds we run on.
#include <gtest/gtest.h>

#include "dscpp/monitor/cpu_peak.h"
#include "dscpp/monitor/flops_profiler.h"

namespace dscpp {
namespace {

std::string cpuinfo(const std::string& vendor, const std::string& mhz, const std::string& flags) {
  return "processor\t: 0\nvendor_id\t: " + vendor + "\ncpu MHz\t\t: " + mhz + "\nflags\t\t: " + flags +
         "\n\nprocessor\t: 1\nvendor_id\t: SomethingElse\n";
}

const std::string kAvx2 = "fpu sse sse2 fma avx avx2";
const std::string kAvx512Bf16 = kAvx2 + " avx512f avx512bw avx512_vnni avx512_bf16";

TEST(CpuPeak, AmdCountsTwo256BitFmaPipesEvenWithAvx512) {
  const auto p = cpu_peak_from_cpuinfo(cpuinfo("AuthenticAMD", "2100.000", kAvx512Bf16), 0, torch::kFloat32, 2);
  EXPECT_EQ(p.flops_per_cycle, 32);
  EXPECT_DOUBLE_EQ(p.ghz, 2.1);
  EXPECT_DOUBLE_EQ(p.flops, 32 * 2.1e9 * 2);
  EXPECT_EQ(p.how, "AMD, 2 x 256-bit FMA: 32 fp32 FLOP/cycle x 2.10 GHz (nominal; turbo can exceed it) x 2 cores");
}

TEST(CpuPeak, AmdZen5CountsTwo512BitFmaPipes) {
  const auto info = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\ncpu MHz\t\t: 2100.000\nflags\t\t: " +
                    kAvx512Bf16 + "\n";
  const auto p = cpu_peak_from_cpuinfo(info, 0, torch::kFloat32, 1);
  EXPECT_EQ(p.flops_per_cycle, 64);
  EXPECT_EQ(p.how, "AMD, 2 x 512-bit FMA: 64 fp32 FLOP/cycle x 2.10 GHz (nominal; turbo can exceed it) x 1 core");
  const auto zen4 = cpu_peak_from_cpuinfo(info.substr(0, info.find("26")) + "25" + info.substr(info.find("26") + 2), 0,
                                          torch::kFloat32, 1);
  EXPECT_EQ(zen4.flops_per_cycle, 32);
}

TEST(CpuPeak, IntelWithAvx512CountsTwo512BitUnits) {
  const auto p = cpu_peak_from_cpuinfo(cpuinfo("GenuineIntel", "2000.0", kAvx2 + " avx512f"), 0, torch::kFloat32, 1);
  EXPECT_EQ(p.flops_per_cycle, 64);
  EXPECT_DOUBLE_EQ(p.flops, 64 * 2e9);
}

TEST(CpuPeak, Avx2OnlyMachineAndTheCpufreqClock) {
  // cpufreq's maximum (kHz) wins over the current "cpu MHz".
  const auto p = cpu_peak_from_cpuinfo(cpuinfo("GenuineIntel", "1200.0", kAvx2), 3.0e6, torch::kFloat32, 4);
  EXPECT_EQ(p.flops_per_cycle, 32);
  EXPECT_DOUBLE_EQ(p.flops, 32 * 3e9 * 4);
  EXPECT_EQ(p.how, "Intel, 2 x 256-bit FMA: 32 fp32 FLOP/cycle x 3.00 GHz x 4 cores");
}

TEST(CpuPeak, Bf16DoublesOnlyWithAvx512Bf16AndAmxCountsTiles) {
  EXPECT_EQ(cpu_peak_from_cpuinfo(cpuinfo("AuthenticAMD", "2000", kAvx512Bf16), 0, torch::kBFloat16, 1)
                .flops_per_cycle, 64);
  EXPECT_EQ(cpu_peak_from_cpuinfo(cpuinfo("AuthenticAMD", "2000", kAvx2), 0, torch::kBFloat16, 1).flops_per_cycle, 32);
  EXPECT_EQ(cpu_peak_from_cpuinfo(cpuinfo("GenuineIntel", "2000", kAvx512Bf16 + " amx_bf16"), 0, torch::kBFloat16, 1)
                .flops_per_cycle, 1024);
  EXPECT_EQ(cpu_peak_from_cpuinfo(cpuinfo("AuthenticAMD", "2000", kAvx2), 0, torch::kFloat64, 1).flops_per_cycle, 16);
}

TEST(CpuPeak, UnreadableCpuinfoGivesZeroNotAGuess) {
  EXPECT_EQ(cpu_peak_from_cpuinfo("", 0, torch::kFloat32, 2).flops, 0);
  EXPECT_EQ(cpu_peak_from_cpuinfo(cpuinfo("AuthenticAMD", "2000", kAvx2), 0, torch::kFloat32, 0).flops, 0);
}

// A model that undercounts the pipes (one FMA instead of two) would put LibTorch's best matmul above the peak. Turbo
// can lift a clock above the nominal one cpuinfo shows on a VM, never to twice it: the bound leaves that room.
TEST(CpuPeak, ThisMachinesMatmulStaysBelowTheModelsPeak) {
  const auto p = cpu_peak_flops(torch::kFloat32, 1);
  ASSERT_GT(p.flops, 0) << "could not read /proc/cpuinfo";
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  const double measured = measure_peak_flops(torch::kFloat32, torch::kCPU, 0.2);
  torch::set_num_threads(threads);
  EXPECT_LT(measured, 2 * p.flops) << "a 1-thread matmul reached " << measured << " FLOP/s, over twice " << p.how;
}

}  // namespace
}  // namespace dscpp
