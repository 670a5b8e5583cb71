// `dscpp plan`: validates a config the way the engine will, then shows what a run would do:
// the resolved config, the batch triangle, model-state memory per rank for every stage, the LR/scale schedule.
#include "plan_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "count_arg.h"
#include "dscpp/comm/block_quantizer.h"
#include "dscpp/comm/topology.h"
#include "dscpp/config/config.h"
#include "dscpp/pipe/partition.h"
#include "dscpp/pipe/schedule.h"
#include "dscpp/schedule/lr_schedule.h"
#include "dscpp/moe/expert_groups.h"
#include "dscpp/monitor/step_log.h"
#include "dscpp/zero/memory_estimate.h"
#include "model/gpt_config.h"

namespace dscpp {
namespace {

ConfigOptions make_options(const PlanArgs& args, std::ostream& err) {
  ConfigOptions options;  // world_size (the data-parallel size) is set once the layout is known
  options.warn = [&err](const std::string& message) { err << "warning: " << message << "\n"; };
  for (const auto& set : args.sets) {
    const size_t eq = set.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw std::invalid_argument("--set '" + set + "': expected key=value, e.g. zero_optimization.stage=3");
    }
    const std::string text = set.substr(eq + 1);
    // Numbers, booleans, arrays and objects as JSON; anything else (AdamW, cpu) as a plain string.
    nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    options.overrides[set.substr(0, eq)] = value.is_discarded() ? nlohmann::json(text) : value;
  }
  // The same rule gpt-train runs, so plan's verdict and resolved config are the run's.
  options.auto_values = gpt::auto_values(args.autos, args.steps, args.hidden_size);
  return options;
}

ModelStateBytes& operator+=(ModelStateBytes& a, const ModelStateBytes& b) {
  a.params += b.params, a.grads += b.grads, a.master32 += b.master32, a.optimizer_state += b.optimizer_state;
  a.device += b.device, a.host += b.host, a.nvme += b.nvme, a.total += b.total;
  return a;
}

// `num_params` a rank holds, of which `expert_params` are experts spread over ep_size ranks: those are partitioned
// over the world_size / ep_size ranks that hold the same experts (the expert-data-parallel group), the rest over
// world_size. ZeRO-3 refuses expert parallelism.
void print_memory_table(const Config& config, int64_t num_params, int world_size, std::ostream& out,
                        int64_t expert_params = 0, int ep_size = 1) {
  const DType dtype = config.compute_dtype();
  const OffloadDevice offload_kind =
      config.zero.offload_optimizer.device == OffloadDevice::kNvme ? OffloadDevice::kNvme : OffloadDevice::kCpu;
  const char* offload_name = offload_kind == OffloadDevice::kNvme ? "nvme" : "cpu";
  const auto optimizer = optimizer_state_shape(config.optimizer);
  out << "\nmodel-state memory per rank (" << optimizer.name << ", " << num_params << " params, " << to_string(dtype)
      << " compute, world_size " << world_size << "; * = this config)\n";
  if (optimizer.assumed) out << "(the config names no optimizer: the script's own is taken to keep Adam's state)\n";
  out << std::left << std::setw(7) << "stage" << std::setw(13) << "params" << std::setw(13) << "grads"
      << std::setw(13) << "fp32 master" << std::setw(13) << "optim state" << std::setw(13) << "device"
      << "| offload_optimizer=" << offload_name << ": device / " << offload_name << "\n";
  const bool configured_offload = config.zero.offload_optimizer.device != OffloadDevice::kNone;
  for (int stage = 0; stage <= 3; ++stage) {
    const bool here = stage == config.zero.stage;
    if (stage == 3 && ep_size > 1) {
      out << std::left << std::setw(7) << (here ? "3 *" : "3") << "refused with expert parallelism (ep_size "
          << ep_size << ")\n";
      continue;
    }
    const int64_t dense = num_params - expert_params;
    ModelStateBytes plain = model_state_bytes(stage, dense, world_size, OffloadDevice::kNone, dtype, optimizer);
    ModelStateBytes off = model_state_bytes(stage, dense, world_size, offload_kind, dtype, optimizer);
    if (expert_params > 0) {
      plain += model_state_bytes(stage, expert_params, world_size / ep_size, OffloadDevice::kNone, dtype, optimizer);
      off += model_state_bytes(stage, expert_params, world_size / ep_size, offload_kind, dtype, optimizer);
    }
    std::string label = std::to_string(stage) + (here && !configured_offload ? " *" : "");
    out << std::left << std::setw(7) << label << std::setw(13) << format_bytes(plain.params) << std::setw(13)
        << format_bytes(plain.grads) << std::setw(13) << format_bytes(plain.master32) << std::setw(13)
        << format_bytes(plain.optimizer_state) << std::setw(13) << format_bytes(plain.device) << "| ";
    if (stage == 0) {
      out << "(offload needs ZeRO stage >= 1)\n";
      continue;
    }
    out << format_bytes(off.device) << " / " << format_bytes(off.host + off.nvme)
        << (here && configured_offload ? " *" : "") << "\n";
  }
}

// ZeRO++ at stage 3: what qwZ and hpZ change in the weights' all-gathers and in memory, per rank and micro-step,
// counting each block gathered twice (forward, and backward after its release), persistent parameters aside.
void print_zeropp(const Config& config, int64_t num_params, int world_size, std::ostream& out) {
  const auto& z = config.zero;
  if (z.stage != 3 || (!z.quantized_weights && z.hpz_partition_size == 1 && !z.quantized_gradients)) return;
  const double elem = config.compute_dtype() == DType::kFloat32 ? 4 : 2;
  const double received = static_cast<double>(num_params) * (world_size - 1) / world_size;
  // int8 plus one fp32 scale per block (comm/block_quantizer.h).
  const double wire = z.quantized_weights ? 1 + 4.0 / kWeightQuantBlock : elem;
  const int64_t hpz = z.hpz_partition_size;
  const double over_data = received * wire * (hpz > 1 ? 1 : 2);
  out << "\nZeRO++ (per rank and micro-step, each block gathered for its forward and again for its backward):\n"
      << "  weight all-gathers over the data-parallel group: " << format_bytes(over_data) << " received (plain ZeRO-3: "
      << format_bytes(2 * received * elem) << ")" << (z.quantized_weights ? "; qwZ: int8 blocks" : "") << "\n";
  if (hpz > 1) {
    out << "  hpZ " << hpz << ": backward all-gathers inside groups of " << hpz << " ranks: "
        << format_bytes(static_cast<double>(num_params) * (hpz - 1) / hpz * elem) << " received; secondary shards "
        << format_bytes(static_cast<double>(num_params) / hpz * elem) << " more memory per rank\n";
  }
  if (z.quantized_gradients) {
    // Half a byte per element plus a 4-byte scale per block (comm/quantized_reduce_scatter.h).
    const double nibble = 0.5 + 4.0 / kGradientQuantBlock;
    const double plain = received * elem;
    out << "  qgZ: gradient reduce-scatter as 4-bit all-to-alls: ";
    if (hpz > 1 && hpz < world_size) {
      const double groups = static_cast<double>(world_size) / hpz;
      out << format_bytes(static_cast<double>(num_params) * (hpz - 1) / hpz * nibble) << " sent inside hpZ groups + "
          << format_bytes(static_cast<double>(num_params) / hpz * (groups - 1) / groups * nibble) << " across them";
    } else {
      out << format_bytes(received * nibble) << " sent";
    }
    out << " (plain ZeRO-3: " << format_bytes(plain) << ")\n";
  }
}

void write_schedule_csv(const Config& config, const PlanArgs& args) {
  if (args.steps < 1) throw std::invalid_argument("--schedule_csv needs --steps N with N >= 1");
  // Without an "optimizer" section the program brings its own, so its base lr is unknown here (nan).
  const double base_lr = config.optimizer ? config.optimizer->lr() : std::nan("");
  std::unique_ptr<LRSchedule> schedule;
  if (config.scheduler) {
    schedule = make_lr_schedule(*config.scheduler, base_lr);
  } else {
    schedule = std::make_unique<ConstantLR>(base_lr);
  }
  double loss_scale = 1.0;
  if (config.fp16.enabled) {
    const LossScalerOptions& s = config.fp16.scaler;
    loss_scale = s.static_scale > 0 ? s.static_scale : std::ldexp(1.0, s.initial_scale_power);
  }
  std::ofstream csv(args.schedule_csv);
  if (!csv) throw std::invalid_argument("--schedule_csv '" + args.schedule_csv + "': cannot open for writing");
  csv << "step,lr,loss_scale\n" << std::setprecision(12);
  // Optimizer step k runs at the schedule's iteration k - 2: the first at the value set when built (-1).
  for (int64_t step = 1; step <= args.steps; ++step) {
    csv << step << "," << schedule->lr_at(step - 2) << "," << loss_scale << "\n";
  }
  if (!csv) throw std::invalid_argument("--schedule_csv '" + args.schedule_csv + "': write failed");
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, PlanArgs& args) {
  CLI::App* plan = app.add_subcommand("plan", "Dry run: validate a DeepSpeed config and show what a run would do");
  plan->add_option("config", args.config_path, "DeepSpeed JSON config")->required();
  plan->add_option("--world_size", args.world_size,
                   "ranks in the job, as launched (default 1); the data-parallel size is this / (pipeline.stages x "
                   "tensor_parallel.autotp_size)")
      ->check(CLI::PositiveNumber);
  auto* params =
      plan->add_option("--params", args.params, "model parameters for the memory table, e.g. 124M, 1.5B, 1.5e9");
  plan->add_option("--model", args.model,
                   "gpt-train's preset (tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl) for the memory table; "
                   "its width also fills \"auto\" bucket sizes")
      ->excludes(params);
  plan->add_option("--set", args.sets, "override a config key before parsing: key=value (repeatable)");
  plan->add_option("--schedule_csv", args.schedule_csv, "write step,lr,loss_scale per optimizer step to FILE");
  plan->add_option("--steps", args.steps,
                   "optimizer steps, as gpt-train's --steps (default 150): the schedule's \"auto\" and the rows of "
                   "--schedule_csv")
      ->check(CLI::PositiveNumber);
  gpt::add_auto_flags(*plan, args.autos);
  plan->add_option("--hidden_size", args.hidden_size, "fills \"auto\": ZeRO bucket sizes from the model width");
  plan->add_option("--moe_experts", args.moe_experts, "with --model: gpt-train's MoE blocks with this many experts");
  plan->add_option("--ep_size", args.ep_size, "with --moe_experts: ranks the experts are spread over");
  return plan;
}

namespace {

// --model: the preset's shape as gpt-train builds it — GPT-2's 50,257 tokens for the gpt2 presets, bytes (256) for
// tiny and small, which gpt-train trains on its embedded corpus.
gpt::GptConfig preset_model(const std::string& name) {
  const bool gpt2 = name.rfind("gpt2", 0) == 0;
  return gpt::GptConfig::preset(name, gpt2 ? 50257 : 256);
}

// gpt-train's pipeline layers (embed, h.0 …, head) with the parameters one rank holds of each under tensor
// parallelism `tp` (the head counts the tied embedding, as each holding stage keeps a copy).
std::vector<LayerInfo> gpt_layers(const gpt::GptConfig& m, int tp) {
  const int64_t C = m.n_embd, embedding = m.vocab_size / tp * C;
  const int64_t block = (m.num_params_per_rank(tp) - embedding - m.block_size * C - 2 * C) / m.n_layer;
  std::vector<LayerInfo> layers{{"Embedding", embedding + m.block_size * C}};
  for (int64_t i = 0; i < m.n_layer; ++i) layers.push_back({"Block", block});
  layers.push_back({"Head", 2 * C + embedding});
  return layers;
}

}  // namespace

// What plan cannot check because it depends on the machine the run starts on; the run checks each at initialize.
std::vector<std::string> machine_dependent_checks(const Config& config) {
  std::vector<std::string> checks;
  if (config.zero.offload_optimizer.device == OffloadDevice::kNvme) {
    checks.push_back("zero_optimization.offload_optimizer.nvme_path '" + config.zero.offload_optimizer.nvme_path +
                     "' exists, is writable and has room for the swap files");
  }
  if (config.zero.offload_param.device == OffloadDevice::kNvme) {
    checks.push_back("zero_optimization.offload_param.nvme_path '" + config.zero.offload_param.nvme_path +
                     "' exists, is writable and has room for the swap files");
  }
  for (const auto& [name, monitor] : {std::pair<const char*, const MonitorConfig&>{"tensorboard", config.tensorboard},
                                      {"csv_monitor", config.csv_monitor},
                                      {"wandb", config.wandb}}) {
    if (monitor.enabled) checks.push_back(std::string(name) + ".output_path is writable");
  }
  if (config.flops_profiler.enabled && !config.flops_profiler.output_file.empty()) {
    checks.push_back("flops_profiler.output_file is writable");
  }
  return checks;
}

void run_plan(const PlanArgs& args_in, std::ostream& out, std::ostream& err) {
  PlanArgs args = args_in;
  std::optional<gpt::GptConfig> model;
  if (!args.model.empty()) {
    model = preset_model(args.model);
    model->moe_experts = args.moe_experts;
    model->validate();
    args.params = std::to_string(model->num_params());
    if (!args.hidden_size) args.hidden_size = model->n_embd;  // as gpt-train fills them
  }
  // Without a model, "auto" bucket sizes are filled from gpt-train's default model, as a gpt-train run would.
  if (!args.hidden_size) args.hidden_size = preset_model(gpt::GptConfig::kDefaultPreset).n_embd;
  ConfigOptions options = make_options(args, err);
  // Read once: the sizes ahead of the parse come from the same text the parse reads (as gpt-train's read_config).
  const std::string text = Config::read_file(args.config_path);
  const auto raw = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);  // the parse reports bad JSON
  // The grid gpt-train forms from the same world: refused, with its words, where the layout does not divide it.
  const ParallelSizes layout = read_parallel_sizes(raw, options.overrides);
  const ProcessTopology grid(args.world_size, layout.pipeline, layout.tensor);
  if (grid.data() % layout.sequence != 0) {
    throw ConfigError("sequence_parallel_size " + std::to_string(layout.sequence) + " does not divide the " +
                      std::to_string(grid.data()) + " data-parallel ranks of world " +
                      std::to_string(args.world_size));
  }
  const int dp = grid.data() / layout.sequence;  // the sequence ranks share their samples
  options.world_size = dp;
  const Config config = Config::from_string(text, options, args.config_path);  // errors name the file
  const int tp = config.tensor_parallel_size, pp = config.pipeline.stages;
  out << config.resolved.dump(2) << "\n";
  const auto unchecked = machine_dependent_checks(config);
  if (!unchecked.empty()) {
    out << "\nnot checked by plan (they depend on the machine; the run checks them when it starts):\n";
    for (const auto& check : unchecked) out << "  - " << check << "\n";
  }
  const BatchConfig& b = config.batch;
  out << "\nbatch: train_batch_size " << b.train_batch_size << " = train_micro_batch_size_per_gpu " << b.micro_batch
      << " x gradient_accumulation_steps " << b.grad_accum << " x data-parallel size " << dp;
  if (tp > 1 || pp > 1) out << " (world_size " << args.world_size << " / (pipeline " << pp << " x tensor " << tp << "))";
  if (layout.sequence > 1) {
    out << " (world_size " << args.world_size << " / sequence parallel " << layout.sequence << "; ZeRO partitions "
        << "over all " << grid.data() << " ranks)";
  }
  out << "\n";
  if (tp > 1 || pp > 1) {
    // The grid the run forms: each model sliced over `tp` adjacent ranks, its layers over `pp` stages, ZeRO over
    // the data-parallel ranks.
    out << "\ngrid: " << grid.world_size() << " ranks = pipeline " << pp << " x data parallel " << dp
        << " x tensor parallel " << tp << " (launch " << grid.world_size()
        << " processes; model fastest, then data, then pipe, as DeepSpeed)\n"
        << grid.describe();
  }
  if (pp > 1) {
    out << "\npipeline: " << pp << " stages, " << b.grad_accum << " micro-batches per step (1F1B): bubble (p - 1) / "
        << "(m + p - 1) = " << bubble_fraction(pp, static_cast<int>(b.grad_accum)) << "; stage s holds at most "
        << "min(p - s, m) micro-batches' activations\n";
  }
  if (model) {
    out << "\nmodel: gpt-train --model " << args.model << ": " << model->num_params() << " params (" << model->n_layer
        << " layers, " << model->n_embd << " wide, " << model->n_head << " heads, vocab " << model->vocab_size
        << ", n_positions " << model->block_size << ")\n";
  }
  const int ep = args.ep_size;
  int64_t expert_params = 0;  // the experts one rank holds
  if (args.moe_experts > 0 || ep != 1) {
    if (!model || args.moe_experts < 1) throw std::invalid_argument("--moe_experts and --ep_size need --model");
    if (tp > 1 || pp > 1) throw std::invalid_argument("--moe_experts with tensor or pipeline parallelism: not supported yet");
    if (ep < 1 || args.moe_experts % ep != 0) {
      throw std::invalid_argument("--moe_experts " + std::to_string(args.moe_experts) +
                                  " is not divisible by --ep_size " + std::to_string(ep));
    }
    const auto groups = moe::expert_parallel_ranks(dp, ep);  // checks ep divides the world
    const auto data_groups = moe::expert_data_parallel_ranks(dp, ep);
    auto list = [](const std::vector<std::vector<int>>& sets) {
      std::string text;
      for (const auto& set : sets) {
        text += text.empty() ? "[" : ", [";
        for (size_t i = 0; i < set.size(); ++i) text += (i ? "," : "") + std::to_string(set[i]);
        text += "]";
      }
      return text;
    };
    const int64_t local = args.moe_experts / ep;
    expert_params = model->num_expert_params() / ep;
    out << "\nmoe: " << args.moe_experts << " experts in each of " << model->moe_blocks() << " MoE blocks (1, 3, …), "
        << local << " per rank (rank r holds experts [" << "(r mod " << ep << ")·" << local << ", +" << local
        << ")); expert-parallel groups " << list(groups) << ", expert-data-parallel groups " << list(data_groups)
        << "\n  per rank: " << model->num_params() - model->num_expert_params() + expert_params << " params, of which "
        << expert_params << " are experts (" << model->num_expert_params() << " in all)\n";
  }
  if (!args.params.empty()) {
    // Sliced over tp ranks, a rank holds its slices: the preset's exact count, or (--params) an even split.
    int64_t per_rank = model ? model->num_params_per_rank(tp) : parse_count(args.params) / tp;
    if (expert_params > 0) per_rank = model->num_params() - model->num_expert_params() + expert_params;
    if (pp > 1 && model) {
      // The stages as PipelineEngine partitions them; the memory table is the largest stage's.
      const auto layers = gpt_layers(*model, tp);
      const auto parts = partition_layers(layers, pp, config.pipeline.partition);
      per_rank = 0;
      for (int stage = 0; stage < pp; ++stage) {
        int64_t params = 0;
        for (int l = parts[stage]; l < parts[stage + 1]; ++l) params += layers[l].params;
        out << (stage == 0 ? "\n" : "") << "stage " << stage << ": layers " << parts[stage] << "-"
            << parts[stage + 1] - 1 << ", " << params << " params per rank\n";
        per_rank = std::max(per_rank, params);
      }
    } else if (pp > 1) {
      per_rank /= pp;
      out << "\npipeline " << pp << ": about " << per_rank << " params per rank (--params split evenly)\n";
    }
    if (tp > 1) {
      out << "\ntensor parallel " << tp << ": " << per_rank << " params per rank"
          << (model ? "" : " (--params split evenly; norms and biases are whole on every rank in practice)") << "\n";
    }
    // ZeRO partitions over the data-parallel ranks and, with sequence parallelism, the sequence ranks among them.
    print_memory_table(config, per_rank, grid.data(), out, expert_params, ep);
    print_zeropp(config, per_rank, grid.data(), out);
  }
  if (!args.schedule_csv.empty()) {
    write_schedule_csv(config, args);
    out << "\nschedule: wrote " << args.steps << " steps to " << args.schedule_csv << "\n";
  }
}

}  // namespace dscpp
