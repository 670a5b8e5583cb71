// DeepSpeed's cold memory estimators: exact bytes per row, worked by hand from the formulas of
// estimate_zero2/3_model_states_mem_needs, and the `dscpp estimate` table and errors from the built binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/subprocess.h"
#include "dscpp/zero/memory_estimate.h"

namespace dscpp {
namespace {

ZeroEstimateSetup setup(int64_t params, int64_t largest, int gpus, int nodes) {
  ZeroEstimateSetup s;
  s.total_params = params;
  s.largest_layer_params = largest;
  s.num_gpus_per_node = gpus;
  s.num_nodes = nodes;
  return s;
}

struct Expected {
  bool offload_param, offload_optimizer, zero_init;
  int64_t cpu, gpu;
};

void expect_zero3_rows(const ZeroEstimateSetup& s, const std::vector<Expected>& expected) {
  const std::vector<ZeroEstimateRow> rows = estimate_zero3_rows(s);
  ASSERT_EQ(rows.size(), expected.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].stage, 3);
    EXPECT_EQ(rows[i].offload_param, expected[i].offload_param) << "row " << i;
    EXPECT_EQ(rows[i].offload_optimizer, expected[i].offload_optimizer) << "row " << i;
    EXPECT_EQ(rows[i].zero_init, expected[i].zero_init) << "row " << i;
    EXPECT_EQ(rows[i].cpu_bytes, expected[i].cpu) << "row " << i;
    EXPECT_EQ(rows[i].gpu_bytes, expected[i].gpu) << "row " << i;
  }
}

// DeepSpeed's docs example (memory.rst): Ψ = 2851M, largest layer 32M, 1 node x 8 GPUs, factor 1.5.
TEST(ZeroEstimate, DeepSpeedDocsExample) {
  const ZeroEstimateSetup s = setup(2'851'000'000, 32'000'000, 8, 1);
  // ZeRO-2, offload: GPU 2Ψ; CPU Ψ·max(4·8, 16)·1.5 = 48Ψ.
  ZeroEstimateRow off = estimate_zero2(s, true);
  EXPECT_EQ(off.gpu_bytes, 5'702'000'000);
  EXPECT_EQ(off.cpu_bytes, 136'848'000'000);
  // ZeRO-2, no offload: GPU 2Ψ + 18Ψ/8 = 5.702e9 + 6.41475e9; CPU Ψ·4·8·1.5.
  ZeroEstimateRow none = estimate_zero2(s, false);
  EXPECT_EQ(none.gpu_bytes, 12'116'750'000);
  EXPECT_EQ(none.cpu_bytes, 136'848'000'000);
  ASSERT_EQ(estimate_zero2_rows(s).size(), 2u);
  EXPECT_TRUE(estimate_zero2_rows(s)[0].offload_optimizer);
  EXPECT_FALSE(estimate_zero2_rows(s)[1].offload_optimizer);
  // ZeRO-3 (4L = 128e6): these print as the docs' 71.69/127.45/63.72/1.43 GB and 0.12/0.78/6.09 GB.
  expect_zero3_rows(s, {
      {true, true, true, 76'977'000'000, 128'000'000},      // CPU 18Ψ·1·1.5
      {true, true, false, 136'848'000'000, 128'000'000},    // CPU Ψ·max(32, 18)·1.5
      {false, true, true, 68'424'000'000, 840'750'000},     // GPU 4L + 2Ψ/8; CPU 16Ψ·1.5
      {false, true, false, 136'848'000'000, 840'750'000},   // CPU Ψ·max(32, 16)·1.5
      {false, false, true, 1'536'000'000, 6'542'750'000},   // GPU 4L + 18Ψ/8; CPU L·4·8·1.5
      {false, false, false, 136'848'000'000, 6'542'750'000}  // CPU Ψ·4·8·1.5
  });
}

// Two nodes x 3 GPUs, Ψ and L that do not divide: DeepSpeed's int() truncations and 1/num_nodes factor.
TEST(ZeroEstimate, MultiNodeTruncates) {
  const int64_t psi = 1'000'000'007;
  const ZeroEstimateSetup s = setup(psi, 12'345'679, 3, 2);  // 4L = 49,382,716
  EXPECT_EQ(estimate_zero2(s, true).gpu_bytes, 2'000'000'014);
  EXPECT_EQ(estimate_zero2(s, true).cpu_bytes, 36'000'000'252);   // Ψ·max(24, 16)·1.5
  EXPECT_EQ(estimate_zero2(s, false).gpu_bytes, 5'000'000'035);   // 2Ψ + 18Ψ/6 (= 3,000,000,021)
  EXPECT_EQ(estimate_zero2(s, false).cpu_bytes, 18'000'000'126);  // Ψ·4·3·1.5
  expect_zero3_rows(s, {
      {true, true, true, 13'500'000'094, 49'382'716},      // 18Ψ·0.5·1.5 = 13,500,000,094.5 → truncated
      {true, true, false, 18'000'000'126, 49'382'716},     // max(12, 9.0) = 12
      {false, true, true, 12'000'000'084, 382'716'051},    // 4L + int(2Ψ/6 = 333,333,335.67)
      {false, true, false, 18'000'000'126, 382'716'051},   // max(12, 8.0) = 12
      {false, false, true, 222'222'222, 3'049'382'737},    // L·4·3·1.5; 4L + 18Ψ/6
      {false, false, false, 18'000'000'126, 3'049'382'737}
  });
}

// One GPU per node on 4 nodes: 18/4 = 4.5 > 4·1, so the float factor wins DeepSpeed's max(); 16/4 = 4.0 ties and
// the integer 4 is kept.
TEST(ZeroEstimate, FloatFactorWinsMax) {
  const int64_t psi = 1'000'000'001;
  const ZeroEstimateSetup s = setup(psi, 1, 1, 4);
  EXPECT_EQ(estimate_zero2(s, true).cpu_bytes, 24'000'000'024);  // max(16, 16) = 16
  EXPECT_EQ(estimate_zero2(s, false).gpu_bytes, 6'500'000'006);  // 2Ψ + int(4,500,000,004.5)
  expect_zero3_rows(s, {
      {true, true, true, 6'750'000'006, 4},        // 18Ψ·0.25·1.5 = 6,750,000,006.75
      {true, true, false, 6'750'000'006, 4},       // Ψ·4.5·1.5
      {false, true, true, 6'000'000'006, 500'000'004},
      {false, true, false, 6'000'000'006, 500'000'004},
      {false, false, true, 6, 4'500'000'008},      // L·4·1·1.5; 4 + int(4,500,000,004.5)
      {false, false, false, 6'000'000'006, 4'500'000'008}
  });
}

TEST(ZeroEstimate, BufferFactorScalesCpuOnly) {
  ZeroEstimateSetup s = setup(2'851'000'000, 32'000'000, 8, 1);
  s.additional_buffer_factor = 1.0;
  EXPECT_EQ(estimate_zero3(s, true, true, true).cpu_bytes, 51'318'000'000);  // 18Ψ
  EXPECT_EQ(estimate_zero3(s, true, true, true).gpu_bytes, 128'000'000);
  EXPECT_EQ(estimate_zero2(s, false).cpu_bytes, 91'232'000'000);  // 32Ψ
  EXPECT_EQ(estimate_zero2(s, false).gpu_bytes, 12'116'750'000);
}

TEST(ZeroEstimate, InvalidSetupsThrow) {
  EXPECT_THROW(estimate_zero2(setup(0, 0, 1, 1), true), std::invalid_argument);
  EXPECT_THROW(estimate_zero3(setup(10, 11, 1, 1), true, true, true), std::invalid_argument);
  EXPECT_THROW(estimate_zero3(setup(10, 1, 0, 1), true, true, true), std::invalid_argument);
  EXPECT_THROW(estimate_zero3(setup(10, 1, 1, 0), true, true, true), std::invalid_argument);
  EXPECT_THROW(estimate_zero3(setup(10, 1, 1, 1), /*offload_param=*/true, false, true), std::invalid_argument);
  ZeroEstimateSetup bad_factor = setup(10, 1, 1, 1);
  bad_factor.additional_buffer_factor = 0;
  EXPECT_THROW(validate(bad_factor), std::invalid_argument);
  try {
    validate(setup(10, 11, 1, 1));
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("largest_layer_params = 11"), std::string::npos) << e.what();
  }
}

// --- the CLI -------------------------------------------------------------------------------------------------

testing::CommandResult estimate(const std::string& args) {
  return testing::run_command(std::string(DSCPP_BINARY_DIR "/dscpp estimate ") + args);
}

TEST(EstimateCli, DocsExampleTable) {
  testing::CommandResult r = estimate("--params 2851M --largest_layer 32e6 --num_gpus 8 --num_nodes 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::string expected =
      "Estimated memory needed for params, optim states and gradients for a:\n"
      "HW: Setup with 1 node, 8 GPUs per node.\n"
      "SW: Model with 2851M total params, 32M largest layer params.\n"
      "\n"
      "ZeRO-2:\n"
      "  per CPU  |  per GPU |   Options\n"
      "  127.45GB |   5.31GB | offload_optimizer=cpu \n"
      "  127.45GB |  11.28GB | offload_optimizer=none\n"
      "\n"
      "ZeRO-3:\n"
      "  per CPU  |  per GPU |   Options\n"
      "   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
      "  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
      "   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
      "  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
      "    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
      "  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0\n";
  EXPECT_EQ(r.out.substr(0, expected.size()), expected) << r.out;
  EXPECT_NE(r.out.find("additional_buffer_factor 1.5"), std::string::npos) << r.out;
}

TEST(EstimateCli, CpuOffloadRowsMultiNodeAndFactor) {
  testing::CommandResult r =
      estimate("--params 1.5B --largest_layer 0.1B --num_gpus 4 --num_nodes 2 --cpu_offload "
               "--additional_buffer_factor 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("HW: Setup with 2 nodes, 4 GPUs per node."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SW: Model with 1500M total params, 100M largest layer params."), std::string::npos);
  // ZeRO-2 offload: GPU 2Ψ = 3e9 B = 2.79 GiB; CPU Ψ·max(32, 16) = 48e9 B = 44.70 GiB.
  EXPECT_NE(r.out.find("   44.70GB |   2.79GB | offload_optimizer=cpu \n"), std::string::npos) << r.out;
  // ZeRO-3 both offloaded, zero_init: CPU 18Ψ/2 = 13.5e9 B = 12.57 GiB; GPU 4L = 0.4e9 B = 0.37 GiB.
  EXPECT_NE(r.out.find("   12.57GB |   0.37GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"),
            std::string::npos) << r.out;
  // ZeRO-3 params on GPU, zero_init=0: GPU 4L + 2Ψ/8 = 0.775e9 B = 0.72 GiB; CPU Ψ·max(16, 8.0) = 24e9 = 22.35 GiB.
  EXPECT_NE(r.out.find("   22.35GB |   0.72GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("offload_optimizer=none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("additional_buffer_factor 1)"), std::string::npos) << r.out;
}

TEST(EstimateCli, WithoutLargestLayerOnlyZero2) {
  testing::CommandResult r = estimate("--params 124M");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("HW: Setup with 1 node, 1 GPU per node."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SW: Model with 124M total params.\n"), std::string::npos) << r.out;
  // One GPU: ZeRO-2 without offload is 2Ψ + 18Ψ = 2.48e9 B = 2.31 GiB; CPU 4Ψ·1.5 = 0.744e9 B = 0.69 GiB.
  EXPECT_NE(r.out.find("    0.69GB |   2.31GB | offload_optimizer=none\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pass --largest_layer"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("zero_init"), std::string::npos) << r.out;
}

TEST(ZeroEstimate, PersistentParamsAddTwoBytesEachToEveryZero3Gpu) {
  ZeroEstimateSetup with = setup(2'851'000'000, 32'000'000, 8, 1);
  with.persistent_params = 1'000'000;
  const ZeroEstimateSetup without = setup(2'851'000'000, 32'000'000, 8, 1);
  const auto rows = estimate_zero3_rows(with), base = estimate_zero3_rows(without);
  ASSERT_EQ(rows.size(), base.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].gpu_bytes, base[i].gpu_bytes + 2'000'000) << "row " << i;
    EXPECT_EQ(rows[i].cpu_bytes, base[i].cpu_bytes) << "row " << i;
  }
  EXPECT_EQ(estimate_zero2(with, false).gpu_bytes, estimate_zero2(without, false).gpu_bytes);  // a ZeRO-3 term
  with.persistent_params = with.total_params + 1;
  EXPECT_THROW(validate(with), std::invalid_argument);
}

// Errors are one line "error: ..." naming the flag, with a non-zero exit.
void expect_error(const testing::CommandResult& r, const std::string& needle) {
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(EstimateCli, PersistentParams) {
  // 64M persistent params on the docs example: +128e6 B on every ZeRO-3 GPU (0.12 -> 0.24 GiB).
  testing::CommandResult r = estimate("--params 2851M --largest_layer 32e6 --num_gpus 8 --persistent_params 64M");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("64000000 persistent params (ZeRO-3 per GPU +128000000 bytes)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("   71.69GB |   0.24GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  127.45GB |   5.31GB | offload_optimizer=cpu \n"), std::string::npos) << r.out;
  expect_error(estimate("--params 1M --largest_layer 1M --persistent_params 2M"),
                    "--persistent_params 2M (2000000) exceeds --params 1M");
}

TEST(EstimateCli, Errors) {
  expect_error(estimate("--num_gpus 8"), "--params is required");
  expect_error(estimate("--params 0"), "--params 0: must be > 0");
  expect_error(estimate("--params lots"), "--params: 'lots' is not a count");
  expect_error(estimate("--params -5"), "--params: '-5' is not a count");
  expect_error(estimate("--params 1B --largest_layer 2B"), "--largest_layer 2B (2000000000) exceeds --params 1B");
  expect_error(estimate("--params 1B --largest_layer 0"), "--largest_layer 0: must be > 0");
  expect_error(estimate("--params 1B --num_gpus 0"), "--num_gpus '0'");
  expect_error(estimate("--params 1B --num_gpus -2"), "--num_gpus '-2'");
  expect_error(estimate("--params 1B --num_nodes 1.5"), "--num_nodes '1.5'");
  expect_error(estimate("--params 1B --additional_buffer_factor 0"), "--additional_buffer_factor '0'");
  expect_error(estimate("--params 100T --num_gpus 100000 --num_nodes 1000"), "overflows");
}

}  // namespace
}  // namespace dscpp
