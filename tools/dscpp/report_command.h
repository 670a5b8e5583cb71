// `dscpp report` (DeepSpeed's ds_report): what this build and this machine offer — LibTorch, communication backends,
// CUDA, the CPU and its SIMD (and so the CPU Adam kernel), threads and BLAS, async I/O for NVMe offload, memory and
// disk. Every probe reports "no" with the reason instead of failing.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>

namespace dscpp {

CLI::App* add_report_command(CLI::App& app);
void run_report(std::ostream& out);

}  // namespace dscpp
