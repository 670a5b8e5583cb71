// `dscpp report` names this build's LibTorch and the machine's probes; `dscpp plot` draws every finite value where
// it belongs (the largest loss at the top of its panel, the smallest at the bottom) and names bad input's line.
#include <gtest/gtest.h>
#include <torch/version.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "../common/subprocess.h"

namespace dscpp::testing {
namespace {

const std::string kDscpp = std::string(DSCPP_BINARY_DIR) + "/dscpp";

TEST(DscppReport, NamesLibTorchAndEveryProbe) {
  const auto r = run_command(kDscpp + " report");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string version = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".";
  EXPECT_NE(r.out.find("LibTorch ................. " + version), std::string::npos) << r.out;
  for (const char* item : {"gloo backend", "nccl backend", "CUDA", "CPU SIMD", "CPU Adam kernel", "ATen CPU kernels",
                           "fp32 matmul", "bf16 matmul", "intra-op threads", "BLAS", "io_uring", "libaio", "memory",
                           "disk free (.)"}) {
    EXPECT_NE(r.out.find(std::string(item) + " ."), std::string::npos) << item << " in\n" << r.out;
  }
  EXPECT_TRUE(std::regex_search(r.out, std::regex("io_uring \\.+ (yes|no \\()"))) << r.out;
}

// Which kernels this CPU gets, read from /proc/cpuinfo independently of the report's own probes: oneDNN's bf16
// matmul where the CPU has AVX-512 BW, VL and DQ (LibTorch's rule), ATen's loop elsewhere; the CPU Adam kernel.
TEST(DscppReport, SaysWhichKernelsThisCpuSelects) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::set<std::string> flags;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string flag; words >> flag;) flags.insert(flag);
    break;
  }
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  const auto r = run_command(kDscpp + " report");
  ASSERT_EQ(r.code, 0) << r.err;
  const bool avx512 = flags.count("avx512f") && flags.count("avx512bw");
  const bool onednn_bf16 = flags.count("avx512bw") && flags.count("avx512vl") && flags.count("avx512dq");
  const bool avx2 = flags.count("avx2") && flags.count("fma") && flags.count("f16c");
  EXPECT_TRUE(std::regex_search(r.out, std::regex(std::string("bf16 matmul \\.+ ") +
                                                  (onednn_bf16 ? "oneDNN" : "ATen loop"))))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(std::string("CPU Adam kernel \\.+ ") +
                                                  (avx512 ? "avx512" : avx2 ? "avx2" : "scalar"))))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("ATen CPU kernels \\.+ [A-Z0-9 ]+ \\(ATEN_CPU_CAPABILITY ")))
      << r.out;
  if (flags.count("avx512_bf16")) EXPECT_NE(r.out.find("avx512_bf16"), std::string::npos) << r.out;
}

// The polylines' points, panel by panel (loss, lr, tokens/s).
std::vector<std::vector<std::pair<double, double>>> polylines(const std::string& svg) {
  std::vector<std::vector<std::pair<double, double>>> out;
  const std::regex line("points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), line); it != std::sregex_iterator(); ++it) {
    std::vector<std::pair<double, double>> points;
    std::istringstream in((*it)[1].str());
    for (std::string p; in >> p;) points.emplace_back(std::stod(p.substr(0, p.find(','))), std::stod(p.substr(p.find(',') + 1)));
    out.push_back(points);
  }
  return out;
}

// One directory for the whole binary: temp_dir starts a directory afresh each time it is asked for.
const std::filesystem::path& plot_dir() {
  static const auto dir = temp_dir("plot");
  return dir;
}

std::string write_metrics(const std::string& name, const std::string& text) {
  const auto path = plot_dir() / name;
  std::ofstream(path) << text;
  return path.string();
}

TEST(DscppPlot, DrawsEachFiniteValueWhereItBelongs) {
  const auto metrics = write_metrics("run.jsonl",
                                     "{\"step\":1,\"loss\":5.0,\"lr\":0.0001,\"tokens_per_s\":900}\n"
                                     "{\"step\":2,\"loss\":null,\"lr\":0.0002,\"tokens_per_s\":1000,\"skipped\":true}\n"
                                     "\n"
                                     "{\"step\":3,\"loss\":3.5,\"lr\":0.0003,\"tokens_per_s\":1100}\n"
                                     "{\"step\":4,\"loss\":2.0,\"lr\":0.0003,\"tokens_per_s\":1000}\n");
  const auto svg_path = plot_dir() / "loss.svg";
  const auto r = run_command(kDscpp + " plot " + metrics + " -o " + svg_path.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + svg_path.string() + " (4 steps)"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("left out 1 non-finite"), std::string::npos) << r.err;
  const auto svg = read_text(svg_path);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  const auto lines = polylines(svg);
  ASSERT_EQ(lines.size(), 3u);
  ASSERT_EQ(lines[0].size(), 3u) << "the null loss is left out";
  ASSERT_EQ(lines[1].size(), 4u);
  // Loss: steps 1, 3, 4 left to right; 5.0 the highest point (smallest y), 2.0 the lowest, 3.5 halfway.
  EXPECT_LT(lines[0][0].first, lines[0][1].first);
  EXPECT_LT(lines[0][1].first, lines[0][2].first);
  EXPECT_LT(lines[0][0].second, lines[0][1].second);
  EXPECT_LT(lines[0][1].second, lines[0][2].second);
  EXPECT_NEAR(lines[0][1].second, (lines[0][0].second + lines[0][2].second) / 2, 0.01);
  // Shared x axis: step 1 at the same x in every panel.
  EXPECT_DOUBLE_EQ(lines[0][0].first, lines[1][0].first);
  EXPECT_DOUBLE_EQ(lines[0][0].first, lines[2][0].first);
}

TEST(DscppPlot, ConstantSeriesAndOneStepStillDraw) {
  const auto metrics = write_metrics("one.jsonl", "{\"step\":7,\"loss\":1.5,\"lr\":0.001,\"tokens_per_s\":5}\n");
  const auto svg_path = plot_dir() / "one.svg";
  const auto r = run_command(kDscpp + " plot " + metrics + " -o " + svg_path.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto lines = polylines(read_text(svg_path));
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& l : lines) {
    ASSERT_EQ(l.size(), 1u);
    EXPECT_TRUE(std::isfinite(l[0].first) && std::isfinite(l[0].second));
  }
}

TEST(DscppPlot, BadInputNamesTheFileAndLine) {
  const auto bad = write_metrics("bad.jsonl", "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":\n");
  auto r = run_command(kDscpp + " plot " + bad + " -o /dev/null");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(bad + ":2: not JSON"), std::string::npos) << r.err;

  r = run_command(kDscpp + " plot /nonexistent/run.jsonl");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cannot read /nonexistent/run.jsonl"), std::string::npos) << r.err;

  const auto empty = write_metrics("empty.jsonl", "{\"note\":\"no steps\"}\n");
  r = run_command(kDscpp + " plot " + empty + " -o /dev/null");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no line with a \"step\""), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dscpp::testing
