// FlopsCounter: thread-local RecordFunction callbacks. A counted op entered while another counted op is running is
// part of it (flash attention's inner kernels, a math attention's bmm), so only the outermost counted op adds.
#include "dscpp/monitor/flops_profiler.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace dscpp {
namespace {

thread_local FlopsCounter* t_counter = nullptr;
thread_local int t_inside_counted = 0;           // counted ops now running on this thread
thread_local int t_inside_backward = 0;          // autograd nodes now running on this thread
thread_local std::vector<std::string> t_scopes;  // FlopsCounter::Scope names, innermost last

struct Counted : at::ObserverContext {};
struct Backward : at::ObserverContext {};

std::vector<int64_t> shape_of(const c10::IValue& value) {
  if (!value.isTensor()) return {};
  const auto& t = value.toTensor();
  return t.defined() ? t.sizes().vec() : std::vector<int64_t>{};
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!t_counter) return nullptr;
  // The backward's products are the backward's (2 × the forward's, by convention), not model forward FLOPs.
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    ++t_inside_backward;
    return std::make_unique<Backward>();
  }
  if (t_inside_backward > 0) return nullptr;
  const std::string op = fn.name();
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& input : fn.inputs()) shapes.push_back(shape_of(input));
  const int64_t flops = matmul_flops(op, shapes);
  if (flops == 0) return nullptr;
  if (t_inside_counted == 0) t_counter->add(op, flops);
  ++t_inside_counted;
  return std::make_unique<Counted>();
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (dynamic_cast<Backward*>(ctx)) {
    --t_inside_backward;
  } else if (ctx) {
    --t_inside_counted;
  }
}

int64_t product(const std::vector<int64_t>& dims, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < dims.size(); ++i) p *= dims[i];
  return p;
}

}  // namespace

int64_t matmul_flops(const std::string& op, const std::vector<std::vector<int64_t>>& in) {
  auto arg = [&](size_t i) -> const std::vector<int64_t>& {
    static const std::vector<int64_t> none;
    return i < in.size() ? in[i] : none;
  };
  if (op == "aten::mm" && arg(0).size() == 2 && arg(1).size() == 2) {  // (m, k) · (k, n)
    return 2 * arg(0)[0] * arg(0)[1] * arg(1)[1];
  }
  if (op == "aten::addmm" && arg(1).size() == 2 && arg(2).size() == 2) {  // bias + (m, k) · (k, n)
    return 2 * arg(1)[0] * arg(1)[1] * arg(2)[1];
  }
  if (op == "aten::bmm" && arg(0).size() == 3 && arg(1).size() == 3) {  // (b, m, k) · (b, k, n)
    return 2 * arg(0)[0] * arg(0)[1] * arg(0)[2] * arg(1)[2];
  }
  if (op == "aten::baddbmm" && arg(1).size() == 3 && arg(2).size() == 3) {
    return 2 * arg(1)[0] * arg(1)[1] * arg(1)[2] * arg(2)[2];
  }
  // Fused attention: q (…, L, E) · kᵀ (…, E, S) and then (…, L, S) · v (…, S, Ev).
  if ((op.rfind("aten::_scaled_dot_product_", 0) == 0 || op == "aten::_flash_attention_forward" ||
       op == "aten::_efficient_attention_forward") &&
      op.find("backward") == std::string::npos && arg(0).size() >= 2 && arg(1).size() >= 2 && arg(2).size() >= 2) {
    const auto& q = arg(0);
    const auto& v = arg(2);
    // Flash's own kernels take (B, L, H, E); the SDPA ops (B, H, L, E): the batch of products is the same.
    const int64_t batch = product(q, 0, q.size() - 2);
    const int64_t L = q[q.size() - 2], E = q.back(), S = arg(1)[arg(1).size() - 2], Ev = v.back();
    return 2 * batch * L * S * E + 2 * batch * L * S * Ev;
  }
  return 0;
}

FlopsCounter::FlopsCounter() : previous_(t_counter) {
  t_counter = this;
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&on_start, &on_end).needsInputs(true).scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}

FlopsCounter::~FlopsCounter() {
  at::removeCallback(handle_);
  t_counter = previous_;
}

void FlopsCounter::add(const std::string& op, int64_t flops) {
  total_ += flops;
  by_op_[op] += flops;
  by_module_[t_scopes.empty() ? std::string("(model)") : t_scopes.back()] += flops;
}

FlopsCounter::Scope::Scope(std::string name) { t_scopes.push_back(std::move(name)); }
FlopsCounter::Scope::~Scope() { t_scopes.pop_back(); }

double measure_peak_flops(torch::ScalarType dtype, const torch::Device& device, double seconds) {
  torch::NoGradGuard no_grad;
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  auto a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  auto c = torch::mm(a, b);  // warm-up: allocation, kernel selection
  double best = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    const auto start = std::chrono::steady_clock::now();
    torch::mm_out(c, a, b);
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
  } while (std::chrono::steady_clock::now() < end);
  return best;
}

std::string format_flops(double flops, const std::string& suffix) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int p = 0;
  while (flops >= 1000 && p < 5) flops /= 1000, ++p;
  char out[48];
  std::snprintf(out, sizeof out, "%.2f %s%s", flops, prefixes[p], suffix.c_str());
  return out;
}

std::string describe(const FlopsProfile& p, int top_modules, int module_depth, bool detailed) {
  char line[512];
  std::snprintf(line, sizeof line,
                "flops profiler, step %lld (%lld micro-steps): forward %s, forward + backward%s %s; step %.1f ms, "
                "%s achieved of %s peak (measured matmul): MFU %.1f%%",
                static_cast<long long>(p.step), static_cast<long long>(p.micro_steps),
                format_flops(static_cast<double>(p.forward_flops)).c_str(),
                p.recompute_fwd_factor > 0 ? " + recompute" : "", format_flops(p.step_flops()).c_str(),
                p.step_s * 1e3, format_flops(p.achieved(), "FLOP/s").c_str(),
                format_flops(p.peak_flops, "FLOP/s").c_str(), 100.0 * p.mfu());
  std::string out = line;
  std::map<std::string, int64_t> modules;
  for (const auto& [name, flops] : p.by_module) {
    std::string cut = name;
    if (module_depth > 0) {
      size_t pos = 0;
      for (int d = 0; d < module_depth && pos != std::string::npos; ++d) pos = name.find('.', pos ? pos + 1 : 0);
      if (pos != std::string::npos) cut = name.substr(0, pos);
    }
    modules[cut] += flops;
  }
  std::vector<std::pair<int64_t, std::string>> ranked;
  for (const auto& [name, flops] : modules) ranked.emplace_back(flops, name);
  std::sort(ranked.rbegin(), ranked.rend());
  if (top_modules > 0 && !ranked.empty()) {
    out += "\n  top modules by forward FLOPs:";
    for (size_t i = 0; i < ranked.size() && i < static_cast<size_t>(top_modules); ++i) {
      std::snprintf(line, sizeof line, " %s %s (%.1f%%)%s", ranked[i].second.c_str(),
                    format_flops(static_cast<double>(ranked[i].first)).c_str(),
                    p.forward_flops ? 100.0 * ranked[i].first / p.forward_flops : 0.0,
                    i + 1 < ranked.size() && i + 1 < static_cast<size_t>(top_modules) ? "," : "");
      out += line;
    }
  }
  if (detailed) {
    out += "\n  forward FLOPs by op:";
    for (const auto& [op, flops] : p.by_op) out += " " + op + " " + format_flops(static_cast<double>(flops));
  }
  return out;
}

}  // namespace dscpp
