// `dscpp report`: one "name .... value" line per item.
#include "report_command.h"

#include <dlfcn.h>
#include <libaio.h>
#include <liburing.h>
#include <ATen/Version.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>

#include "dscpp/compat/torch_compat.h"
#include "dscpp/monitor/step_log.h"
#include "dscpp/optim/cpu_adam.h"

namespace dscpp {
namespace {

// The value after "key\t: " of the first /proc line starting with `key` (cpuinfo, meminfo).
std::string proc_field(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    return value;
  }
  return "";
}

std::string cpu_flags() {
  std::istringstream flags(proc_field("/proc/cpuinfo", "flags"));
  std::string out;
  for (std::string flag; flags >> flag;) {
    for (const char* wanted : {"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                               "avx512_bf16", "amx_bf16"}) {
      if (flag == wanted) out += (out.empty() ? "" : " ") + flag;
    }
  }
  return out.empty() ? "none of avx/avx2/fma/avx512" : out;
}

// The vectorised ATen kernels LibTorch dispatches to on this CPU (elementwise ops, softmax, norms...), as its build
// configuration reports them (the dispatcher's own query is not exported).
std::string aten_kernels() {
  const char* forced = std::getenv("ATEN_CPU_CAPABILITY");
  const std::string key = "CPU capability usage: ";
  const auto config = at::show_config();
  const auto at = config.find(key);
  const std::string used = at == std::string::npos
                               ? "not reported"
                               : config.substr(at + key.size(), config.find('\n', at) - at - key.size());
  return used + " (ATEN_CPU_CAPABILITY " + (forced ? forced : "unset") + ")";
}

// fp32 matrix products go to the BLAS LibTorch links: the PyPI wheel's is MKL, linked in; another build's may be
// OpenBLAS, which picks its kernels by CPU at load time and says which.
std::string fp32_matmul() {
  if (at::hasMKL()) return at::get_mkl_version();
  using Info = char* (*)();
  const auto config = reinterpret_cast<Info>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  const auto core = reinterpret_cast<Info>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!config || !core) return "BLAS (not OpenBLAS: kernels not reported)";
  return std::string(config()) + " (" + core() + " kernels)";
}

std::string bf16_matmul() {
  if (compat::cpu_bf16_matmul_uses_onednn()) {
    return "oneDNN (" + at::get_mkldnn_version() + "; the CPU has AVX-512 BW/VL/DQ)";
  }
  if (!at::hasMKLDNN()) return "ATen loop, fp32 accumulation (this LibTorch has no oneDNN)";
  if (!at::globalContext().userEnabledMkldnn()) return "ATen loop, fp32 accumulation (oneDNN disabled)";
  return "ATen loop, fp32 accumulation (no AVX-512 BW/VL/DQ for oneDNN)";
}

std::string io_uring_status() {
  io_uring ring;
  const int rc = io_uring_queue_init(2, &ring, 0);
  if (rc < 0) return std::string("no (") + std::strerror(-rc) + "); NVMe offload falls back to libaio";
  io_uring_queue_exit(&ring);
  return "yes (liburing)";
}

std::string libaio_status() {
  io_context_t ctx = nullptr;
  const int rc = io_setup(1, &ctx);
  if (rc < 0) return std::string("no (") + std::strerror(-rc) + ")";
  io_destroy(ctx);
  return "yes";
}

// BLAS_INFO / LAPACK_INFO from LibTorch's build configuration.
std::string blas() {
  std::istringstream config(at::show_config());
  std::string out;
  for (std::string line; std::getline(config, line);) {
    for (const char* key : {"BLAS_INFO=", "LAPACK_INFO="}) {
      const auto at = line.find(key);
      if (at == std::string::npos) continue;
      auto value = line.substr(at + std::strlen(key));
      value = value.substr(0, value.find(','));
      out += (out.empty() ? "" : ", ") + std::string(key).substr(0, std::strlen(key) - 1) + " " + value;
    }
  }
  return out.empty() ? "(not reported by this LibTorch)" : out;
}

void row(std::ostream& out, const std::string& name, const std::string& value) {
  out << std::left << std::setw(26) << std::setfill('.') << (name + " ") << ' ' << value << '\n';
}

}  // namespace

CLI::App* add_report_command(CLI::App& app) {
  return app.add_subcommand("report", "The environment: LibTorch, backends, CUDA, CPU SIMD, threads, BLAS, async "
                                      "I/O, memory (DeepSpeed's ds_report)");
}

void run_report(std::ostream& out) {
  out << "deepspeed.cpp environment report\n";
  row(out, "deepspeed.cpp", DSCPP_VERSION);
  row(out, "LibTorch", compat::torch_version());
  row(out, "gloo backend", "yes (torch c10d)");
#ifdef DSCPP_WITH_NCCL
  row(out, "nccl backend", "yes (torch c10d)");
#elif defined(DSCPP_TORCH_HAS_CUDA)
  row(out, "nccl backend", "not compiled (this LibTorch has CUDA, but the build found no nccl.h)");
#else
  row(out, "nccl backend", "not compiled (this LibTorch has no CUDA)");
#endif
  const bool cuda = torch::cuda::is_available();
  row(out, "CUDA", cuda ? "yes, " + std::to_string(torch::cuda::device_count()) + " device(s)" : "no");
  row(out, "CPU", proc_field("/proc/cpuinfo", "model name") + ", " +
                      std::to_string(std::thread::hardware_concurrency()) + " logical cores");
  row(out, "CPU SIMD", cpu_flags());
  row(out, "CPU Adam kernel", to_string(best_simd_path()));
  row(out, "ATen CPU kernels", aten_kernels());
  row(out, "fp32 matmul", fp32_matmul());
  row(out, "bf16 matmul", bf16_matmul());
  const char* omp = std::getenv("OMP_NUM_THREADS");
  row(out, "intra-op threads", std::to_string(at::get_num_threads()) + " (OMP_NUM_THREADS " +
                                   (omp ? omp : "unset") + ")");
  row(out, "BLAS", blas());
  row(out, "io_uring", io_uring_status());
  row(out, "libaio", libaio_status());
  row(out, "memory", proc_field("/proc/meminfo", "MemTotal"));
  std::error_code ec;
  const auto space = std::filesystem::space(".", ec);
  row(out, "disk free (.)", ec ? "unknown (" + ec.message() + ")" : format_bytes(static_cast<double>(space.available)));
}

}  // namespace dscpp
