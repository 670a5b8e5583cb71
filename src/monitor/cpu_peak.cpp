// cpu_peak_flops: see the header for the model of the vector units; this file reads /proc/cpuinfo and applies it.
#include "dscpp/monitor/cpu_peak.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace dscpp {
namespace {

// The value of the first "key : value" line whose key is `key`, or "".
std::string field(const std::string& cpuinfo, const std::string& key) {
  std::istringstream lines(cpuinfo);
  std::string line;
  while (std::getline(lines, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto name = line.substr(0, colon);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.pop_back();
    if (name != key) continue;
    const auto start = line.find_first_not_of(' ', colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

CpuPeak cpu_peak_from_cpuinfo(const std::string& cpuinfo, double max_khz, torch::ScalarType dtype, int cores) {
  CpuPeak peak;
  std::set<std::string> flags;
  std::istringstream words(field(cpuinfo, "flags"));
  for (std::string w; words >> w;) flags.insert(w);
  const std::string vendor = field(cpuinfo, "vendor_id");
  const bool amd = vendor == "AuthenticAMD", intel = vendor == "GenuineIntel";
  const std::string family_text = field(cpuinfo, "cpu family");
  const int family = family_text.empty() ? 0 : std::atoi(family_text.c_str());
  const std::string mhz = field(cpuinfo, "cpu MHz");
  peak.ghz = max_khz > 0 ? max_khz / 1e6 : (mhz.empty() ? 0.0 : std::stod(mhz) / 1e3);
  peak.cores = cores;
  if (flags.empty() || peak.ghz <= 0 || cores <= 0) return peak;

  double fp32 = 8;  // SSE: 4 lanes, a multiply and an add port
  std::string units = "SSE, 4 lanes x (mul + add)";
  if (flags.count("fma") && flags.count("avx2")) {
    fp32 = 32;
    units = "2 x 256-bit FMA";
    if (intel && flags.count("avx512f")) fp32 = 64, units = "2 x 512-bit FMA";
    // Zen 4's AVX-512 is two 256-bit halves: no more FLOP/cycle. Zen 5 (family 26) executes 512 bits at once on its
    // desktop and server parts (measured here: one EPYC core's LibTorch matmul ran 98 GFLOP/s at 2.1 GHz nominal,
    // past 256-bit units' 67); its laptop parts (Strix Point) halve that again, which cpuinfo does not tell.
    if (amd) {
      const bool zen5 = family >= 26 && flags.count("avx512f");
      fp32 = zen5 ? 64 : 32, units = zen5 ? "2 x 512-bit FMA" : "2 x 256-bit FMA";
    }
  }
  double per_cycle = fp32;
  std::string dtype_name = "fp32";
  if (dtype == torch::kBFloat16) {
    dtype_name = "bf16";
    if (flags.count("amx_bf16")) {
      per_cycle = 1024, units = "AMX bf16 tiles";
    } else if (flags.count("avx512_bf16")) {
      per_cycle = 2 * fp32, units += " + avx512_bf16 pairs";
    } else {
      units += ", bf16 computed in fp32";
    }
  } else if (dtype == torch::kFloat64) {
    per_cycle = fp32 / 2, dtype_name = "fp64";
  }
  peak.flops_per_cycle = per_cycle;
  peak.flops = per_cycle * peak.ghz * 1e9 * cores;
  char how[200];
  std::snprintf(how, sizeof how, "%s, %s: %.0f %s FLOP/cycle x %.2f GHz%s x %d core%s",
                amd ? "AMD" : intel ? "Intel" : vendor.c_str(), units.c_str(), per_cycle, dtype_name.c_str(),
                peak.ghz, max_khz > 0 ? "" : " (nominal; turbo can exceed it)", cores, cores == 1 ? "" : "s");
  peak.how = how;
  return peak;
}

CpuPeak cpu_peak_flops(torch::ScalarType dtype, int cores) {
  if (cores <= 0) cores = torch::get_num_threads();
  double max_khz = 0;
  const std::string freq = read_file("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  if (!freq.empty()) max_khz = std::stod(freq);
  return cpu_peak_from_cpuinfo(read_file("/proc/cpuinfo"), max_khz, dtype, cores);
}

}  // namespace dscpp
