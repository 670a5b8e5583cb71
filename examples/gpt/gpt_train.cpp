// gpt-train: the main job. Trains a GPT-2-architecture decoder with the engine from a DeepSpeed config.
// With no arguments it trains the `small` preset on the embedded corpus and shows the loss falling.
#include <CLI/CLI.hpp>
#include <sys/stat.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>

#include "auto_flags.h"
#include "data/batch_sampler.h"
#include "data/token_dataset.h"
#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/compat/torch_compat.h"
#include "dscpp/dscpp.h"
#include "dscpp/monitor/flops_profiler.h"
#include "dscpp/monitor/memory_tracker.h"
#include "dscpp/monitor/cpu_peak.h"
#include "dscpp/monitor/metrics_jsonl.h"
#include "dscpp/monitor/step_log.h"
#include "gpt_pipeline.h"
#include "model/compression.h"
#include "model/gpt.h"
#include "progress_bar.h"
#include "text_generation.h"

namespace {

// Disk blocks held by this rank's NVMe swap files, measured from outside the swap layer: bench/soak watches it for
// growth (the metrics' optimizer_swap.file_bytes is what the layer reserved, which cannot show a leak of its own).
// The swap layer unlinks its files once open (they vanish with the process), so they are found through
// /proc/self/fd, not by listing nvme_path. 0 without NVMe offload.
int64_t swap_file_bytes(const dscpp::Config& config) {
  std::vector<std::string> dirs;
  for (const auto* offload : {&config.zero.offload_optimizer.nvme_path, &config.zero.offload_param.nvme_path}) {
    if (!offload->empty()) dirs.push_back(std::filesystem::weakly_canonical(*offload).string() + "/");
  }
  if (dirs.empty()) return 0;
  int64_t bytes = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(it->path(), link_ec).string();
    const auto in_dir = [&](const std::string& dir) { return target.rfind(dir, 0) == 0; };
    const bool swap = target.find(".swap") != std::string::npos && std::any_of(dirs.begin(), dirs.end(), in_dir);
    struct stat st {};
    if (swap && ::stat(it->path().c_str(), &st) == 0) bytes += static_cast<int64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

// Used when --deepspeed_config is not given: every "auto" is filled from the HF-style flags below.
constexpr const char* kDefaultConfig = R"json({
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "steps_per_print": 10,
  "bf16": {"enabled": "auto"},
  "fp16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "betas": [0.9, 0.95]}},
  "scheduler": {"type": "WarmupCosineLR",
                "params": {"total_num_steps": "auto", "warmup_num_steps": "auto", "warmup_type": "linear",
                           "cos_min_ratio": 0.1}}
})json";

struct Args {
  std::string deepspeed_config;
  std::string model = gpt::GptConfig::kDefaultPreset;
  std::optional<int64_t> n_layer, n_embd, n_head, seq_len;
  std::string data;
  std::string data_order = "sequential";
  std::string device = "auto";
  int64_t steps = gpt::kDefaultSteps;
  uint64_t seed = 1234;
  std::string metrics;
  std::string save_16bit;
  std::string save_dir, load_dir, load_tag, init_from;
  std::string compression;  // a JSON file whose compression_training section replaces the config's
  int64_t tiled_loss = 0;    // positions per tile of the loss (0: the whole logits at once)
  std::string sparse_attention;  // a layout mode: the config's sparse_attention.mode
  int64_t save_interval = 0;
  bool no_progress = false;
  bool zero_init = true;
  bool activation_checkpointing = false;
  double dropout = 0.0;
  std::optional<int> tensor_parallel;  // fills tensor_parallel.autotp_size
  std::optional<int> pipeline_parallel;  // fills pipeline.stages
  std::optional<int> sequence_parallel;  // fills sequence_parallel_size
  std::optional<std::string> partition;  // fills pipeline.partition
  std::optional<double> peak_tflops;  // per rank; default: measured
  // Mixture of Experts (GptConfig::moe_experts; 0: dense) and its expert parallelism.
  int64_t moe_experts = 0;
  int moe_top_k = 1;
  int ep_size = 1;
  double moe_loss_coeff = 0.01;
  bool moe_use_residual = false;
  std::string moe_noisy_gate_policy = "None";
  dscpp::moe::GateOptions moe_gate;  // capacity, dropping, RTS, 2nd-expert sampling (k: moe_top_k)
  gpt::AutoFlags autos;  // the HF-style flags that fill "auto" (shared with `dscpp plan`)
  gpt::TextGeneration generation;  // --generate
};

// Cumulative NVMe swap counters (zero without offload to nvme).
nlohmann::json swap_json(const dscpp::StateStore::SwapStats& s) {
  return {{"file_bytes", s.file_bytes}, {"read_bytes", s.read_bytes}, {"written_bytes", s.written_bytes},
          {"wait_s", s.wait_s}};
}

// This step's seconds per phase (fwd, bwd, bwd_inner, bwd_allreduce, step), summed over its micro-steps.
nlohmann::json times_json(const dscpp::PhaseTimes& t) {
  nlohmann::json out;
  for (size_t i = 0; i < dscpp::kPhases; ++i) out[dscpp::phase_name(static_cast<dscpp::Phase>(i))] = t.seconds[i];
  return out;
}

void add_flags(CLI::App& app, Args& a) {
  app.add_option("--deepspeed_config", a.deepspeed_config, "DeepSpeed JSON config (default: an embedded AdamW config)");
  app.add_option("--model", a.model, "preset: tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl");
  app.add_option("--n_layer", a.n_layer, "override the preset's layer count");
  app.add_option("--n_embd", a.n_embd, "override the preset's width");
  app.add_option("--n_head", a.n_head, "override the preset's head count");
  app.add_option("--dropout", a.dropout, "dropout after embeddings, on attention weights and residual branches");
  app.add_option("--tensor_parallel", a.tensor_parallel,
                 "slice each model replica over this many ranks (Megatron-style: heads, MLP width, vocabulary); "
                 "fills tensor_parallel.autotp_size; the data-parallel size is world / this")
      ->check(CLI::PositiveNumber);
  app.add_option("--pipeline_parallel", a.pipeline_parallel,
                 "split each model replica into this many pipeline stages (the embedding, the blocks, the tied head "
                 "as layers; DeepSpeed's 1F1B schedule over --grad_accum micro-batches); fills pipeline.stages; the "
                 "data-parallel size is world / (this × --tensor_parallel)")
      ->check(CLI::PositiveNumber);
  app.add_option("--sequence_parallel", a.sequence_parallel,
                 "split each sequence over this many consecutive ranks (DeepSpeed-Ulysses: attention between "
                 "all-to-alls); fills sequence_parallel_size; the data-parallel size is world / this")
      ->check(CLI::PositiveNumber);
  app.add_option("--partition", a.partition,
                 "how layers go to pipeline stages: parameters, uniform or type:REGEX (fills pipeline.partition)");
  app.add_flag("--activation_checkpointing", a.activation_checkpointing,
               "keep only each block's input and recompute the block in backward (the config's "
               "activation_checkpointing section says where inputs are kept)");
  app.add_option("--device", a.device, "cpu, cuda (this rank's GPU, cuda:LOCAL_RANK) or auto (cuda where present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--seq_len", a.seq_len, "tokens per sample (default: the block size, at most 128)");
  app.add_option("--data", a.data, "text file (bytes) or token .bin (llm.c layout or raw uint16); default: embedded");
  app.add_option("--data_order", a.data_order, "sequential or shuffled")->check(CLI::IsMember({"sequential", "shuffled"}));
  app.add_option("--steps", a.steps, "total optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "seed for model init and data order");
  app.add_option("--metrics", a.metrics, "write one JSON line per optimizer step here");
  app.add_option("--save_16bit", a.save_16bit,
                 "after training, write the whole model's weights here as safetensors (DeepSpeed's save_16bit_model; "
                 "ZeRO-3 needs stage3_gather_16bit_weights_on_model_save)");
  app.add_option("--save_dir", a.save_dir, "write checkpoints here (every --save_interval steps and at the end)");
  app.add_option("--save_interval", a.save_interval, "steps between checkpoints (0: only at the end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--load_dir", a.load_dir, "resume from the checkpoint `latest` names here (any world size / stage); "
                 "a directory holding no checkpoint yet starts from step 0");
  app.add_option("--load_tag", a.load_tag, "resume from this tag of --load_dir instead of `latest`");
  app.add_option("--compression", a.compression,
                 "DeepSpeed Compression: the compression_training section of this JSON file (a DeepSpeed config, or "
                 "the section alone) replaces the config's; the blocks' linear layers are compressed as it says "
                 "(docs/compression.md)");
  app.add_option("--tiled_loss", a.tiled_loss,
                 "the loss N positions at a time (ALST's tiled loss): the whole logits never exist at once; 0: off")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--sparse_attention", a.sparse_attention,
                 "block-sparse attention (DeepSpeed's sparse_attention section, whose other keys the config gives): "
                 "dense|fixed|variable|bigbird|bslongformer (docs/parallelism.md)");
  app.add_option("--init_from", a.init_from,
                 "start from HF GPT-2 weights: a model.safetensors, or a directory with one or a sharded index");
  app.add_flag("--no_progress", a.no_progress, "no progress bar even on a terminal");
  app.add_option("--peak_tflops", a.peak_tflops,
                 "the device's peak TFLOP/s in the compute dtype, for MFU (default: measured with a matmul)")
      ->check(CLI::PositiveNumber);
  app.add_option("--zero_init", a.zero_init,
                 "ZeRO-3: build the model partitioned, one block at a time (DeepSpeed's zero.Init; default 1); 0 "
                 "builds it whole on every rank first");
  app.add_option("--moe_experts", a.moe_experts,
                 "MoE: experts in place of the MLP in every other block (DeepSpeed-MoE's GPT); 0: dense");
  app.add_option("--moe_top_k", a.moe_top_k, "MoE: experts per token, 1 or 2");
  app.add_option("--ep_size", a.ep_size, "MoE: ranks the experts are spread over (divides the data-parallel size)");
  app.add_option("--moe_loss_coeff", a.moe_loss_coeff, "MoE: weight of the gates' load-balancing loss (0.01)");
  app.add_option("--moe_capacity_factor", a.moe_gate.capacity_factor, "MoE: tokens an expert takes, × its fair share");
  app.add_option("--moe_eval_capacity_factor", a.moe_gate.eval_capacity_factor, "MoE: the same, evaluating");
  app.add_option("--moe_min_capacity", a.moe_gate.min_capacity, "MoE: an expert's capacity at least (4)");
  app.add_option("--moe_drop_tokens", a.moe_gate.drop_tokens, "MoE: true|false: drop tokens over capacity (true)");
  app.add_option("--moe_use_rts", a.moe_gate.use_rts, "MoE: true|false: random token selection (true)");
  app.add_option("--moe_use_residual", a.moe_use_residual, "MoE: true|false: Residual-MoE (false)");
  app.add_option("--moe_top2_2nd_expert_sampling", a.moe_gate.top2_2nd_expert_sampling,
                 "MoE: true|false: Gumbel noise on the second choice (true)");
  app.add_option("--moe_noisy_gate_policy", a.moe_noisy_gate_policy, "MoE: None, Jitter or RSample (None)");
  gpt::add_auto_flags(app, a.autos);
  gpt::add_generation_flags(app, a.generation);
}

// The config as given: the embedded default, or --deepspeed_config's file, read once for both of its readings (the
// model-parallel sizes ahead of the parse, then the parse).
struct ConfigSource {
  std::string path;  // "" for the embedded default
  std::string text;
};

ConfigSource read_config(const Args& a) {
  if (a.deepspeed_config.empty()) return {"", kDefaultConfig};
  return {a.deepspeed_config, dscpp::Config::read_file(a.deepspeed_config)};
}

dscpp::Config load_config(const Args& a, const ConfigSource& source, int world_size, int64_t hidden_size) {
  dscpp::ConfigOptions options;
  options.world_size = world_size;
  options.auto_values = gpt::auto_values(a.autos, a.steps, hidden_size);
  if (a.tensor_parallel) options.overrides["tensor_parallel.autotp_size"] = *a.tensor_parallel;
  if (a.pipeline_parallel) options.overrides["pipeline.stages"] = *a.pipeline_parallel;
  if (a.sequence_parallel) options.overrides["sequence_parallel_size"] = *a.sequence_parallel;
  if (a.partition) options.overrides["pipeline.partition"] = *a.partition;
  if (!a.sparse_attention.empty()) options.overrides["sparse_attention.mode"] = a.sparse_attention;
  if (!a.compression.empty()) {
    const auto file = nlohmann::json::parse(dscpp::Config::read_file(a.compression), nullptr, false);
    if (!file.is_object()) throw dscpp::ConfigError(a.compression + ": --compression expects a JSON object");
    options.overrides["compression_training"] = file.contains("compression_training") ? file["compression_training"]
                                                                                       : file;
  }
  return dscpp::Config::from_string(source.text, options, source.path);  // errors name the file
}

// The config's model-parallel sizes (dscpp::read_parallel_sizes), read ahead of the parse, which needs the
// data-parallel size they decide; a file that does not parse gives 1s here and its error at the parse.
dscpp::ParallelSizes file_layout(const ConfigSource& source) {
  if (source.path.empty()) return {};
  return dscpp::read_parallel_sizes(nlohmann::json::parse(source.text, nullptr, /*allow_exceptions=*/false));
}

// A layout size: the flag, else the file's `section.key` (`from_file`). A flag that contradicts the file is an error.
int layout_size(const Args& a, const std::optional<int>& flag, int from_file, const char* flag_name,
                const char* section, const char* key) {
  if (flag && from_file > 1 && *flag != from_file) {
    throw std::invalid_argument(std::string(flag_name) + " " + std::to_string(*flag) + " contradicts " +
                                a.deepspeed_config + "'s " + section + (*section ? "." : "") + key + " " +
                                std::to_string(from_file));
  }
  return flag.value_or(from_file);
}

// A config without an "optimizer" section (an HF Trainer user's) gets the AdamW the HF Trainer would build from its
// flags and pass to deepspeed.initialize: --lr, --weight_decay, HF's betas (0.9, 0.999) and eps 1e-8.
dscpp::OptimizerConfig hf_trainer_adamw(const Args& a) {
  dscpp::AdamOptions o;
  o.lr = a.autos.lr;
  o.weight_decay = a.autos.weight_decay;
  o.betas = {0.9, 0.999};
  o.eps = 1e-8;
  return {"AdamW", o};
}

// --init_from's config.json (HF's GPT2Config, beside the weights) when there is one: the checkpoint's shape wins
// over the preset — its vocabulary (padded, e.g. 50304, or not) and its n_positions — and a shape flag that
// contradicts it is an error. The data's vocabulary may be smaller than the table: the loss then covers only it.
void apply_hf_config(const Args& a, int64_t data_vocab, gpt::GptConfig& c) {
  namespace fs = std::filesystem;
  const fs::path from(a.init_from);
  const fs::path file = (fs::is_directory(from) ? from : from.parent_path()) / "config.json";
  if (!fs::exists(file)) return;
  std::ifstream in(file);
  nlohmann::json hf = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  auto read = [&](std::initializer_list<const char*> keys, const char* flag, std::optional<int64_t> given,
                  int64_t& field) {
    for (const char* key : keys) {
      if (!hf.is_object() || !hf.contains(key)) continue;
      if (!hf[key].is_number_integer() || hf[key].get<int64_t>() < 1) {
        throw std::invalid_argument("--init_from: " + file.string() + ": " + key + " must be a positive integer");
      }
      const int64_t value = hf[key].get<int64_t>();
      if (given && *given != value) {
        throw std::invalid_argument(std::string(flag) + " " + std::to_string(*given) + " contradicts " +
                                    file.string() + " (" + key + " " + std::to_string(value) + ")");
      }
      field = value;
      return;
    }
  };
  if (!hf.is_object()) throw std::invalid_argument("--init_from: " + file.string() + " is not a JSON object");
  read({"n_layer"}, "--n_layer", a.n_layer, c.n_layer);
  read({"n_embd"}, "--n_embd", a.n_embd, c.n_embd);
  read({"n_head"}, "--n_head", a.n_head, c.n_head);
  read({"n_positions", "n_ctx"}, "--seq_len", std::nullopt, c.block_size);
  read({"vocab_size"}, "vocab_size", std::nullopt, c.vocab_size);
  if (hf.contains("layer_norm_epsilon") && hf["layer_norm_epsilon"].is_number()) {
    c.layer_norm_eps = hf["layer_norm_epsilon"].get<double>();
  }
  if (data_vocab > c.vocab_size) {
    throw std::invalid_argument("--init_from: " + file.string() + " has a " + std::to_string(c.vocab_size) +
                                "-token vocabulary, but --data uses " + std::to_string(data_vocab) + " tokens");
  }
  if (data_vocab < c.vocab_size) c.data_vocab_size = data_vocab;
}

gpt::GptConfig model_config(const Args& a, int64_t vocab_size) {
  auto c = gpt::GptConfig::preset(a.model, vocab_size);
  if (a.n_layer) c.n_layer = *a.n_layer;
  if (a.n_embd) c.n_embd = *a.n_embd;
  if (a.n_head) c.n_head = *a.n_head;
  if (!a.init_from.empty()) apply_hf_config(a, vocab_size, c);
  c.dropout = a.dropout;
  c.moe_experts = a.moe_experts;
  c.moe_top_k = a.moe_top_k;
  c.moe_use_residual = a.moe_use_residual;
  c.validate();
  return c;
}

// The MoE blocks' routing from the --moe_* flags, checked; the groups are added once the comm exists. What MoE does
// not combine with yet is refused by name.
gpt::MoeSettings moe_settings(const Args& a, int tp, int pp) {
  gpt::MoeSettings moe;
  if (a.moe_experts == 0) {
    if (a.ep_size != 1) throw std::invalid_argument("--ep_size " + std::to_string(a.ep_size) + " needs --moe_experts");
    return moe;
  }
  if (tp > 1 || pp > 1) {
    throw std::invalid_argument("--moe_experts with " + std::string(tp > 1 ? "tensor" : "pipeline") +
                                " parallelism is not supported yet");
  }
  if (a.ep_size < 1) throw std::invalid_argument("--ep_size must be >= 1, got " + std::to_string(a.ep_size));
  if (a.moe_experts % a.ep_size != 0) {
    throw std::invalid_argument("--moe_experts " + std::to_string(a.moe_experts) + " is not divisible by --ep_size " +
                                std::to_string(a.ep_size));
  }
  moe.gate = a.moe_gate;
  moe.gate.k = a.moe_top_k;
  moe.gate.noisy_gate_policy = dscpp::moe::parse_noisy_gate_policy(a.moe_noisy_gate_policy);
  moe.gate.validate();
  moe.ep_size = a.ep_size;
  moe.loss_coeff = a.moe_loss_coeff;
  return moe;
}

// --init_from: every parameter from HF GPT-2 weights. A file holding parameters this model lacks (another depth)
// is an error rather than a silent partial load; one lacking a parameter of the model fails in load_weights. The
// file is opened inside load_weights' source, so a rank that cannot open it fails the load on every rank.
void init_from_hf(dscpp::Engine& engine, torch::nn::Module& model, const std::string& path, int rank) {
  std::set<std::string> ours;
  for (const auto& item : model.named_parameters()) ours.insert(item.key());
  std::unique_ptr<dscpp::HfGpt2Weights> weights;
  engine.load_weights([&](const std::string& name, const std::vector<int64_t>& shape) {
    if (!weights) {
      weights = std::make_unique<dscpp::HfGpt2Weights>(path);
      for (const auto& stored : weights->names()) {
        if (!ours.count(stored)) {
          throw std::invalid_argument("--init_from " + path + ": holds parameter '" + stored + "', which this model " +
                                      "(--model/--n_layer/--n_embd) does not have");
        }
      }
    }
    return weights->read(name, shape);
  });
  if (rank == 0) std::cerr << "[gpt-train] initialised from " << path << std::endl;
}

// Where this rank sits: its device and the rank grid — tensor-parallel groups of adjacent ranks, then data
// parallelism, then pipeline stages (DeepSpeed's order). The engine's comm is the data-parallel group; every rank of a
// model-parallel group and of a pipeline reads the same rows (the first stage their inputs, the last their targets).
struct Placement {
  dscpp::DistEnv env;
  torch::Device device{torch::kCPU};
  int tp = 1, pp = 1, dp = 1, dp_rank = 0;
  // DeepSpeed-Ulysses: sp consecutive ranks read the same rows and each keeps its sp_rank-th part of every sequence;
  // dp counts the sample-reading ranks (world / sp), while the engine's group (every rank) partitions over them all.
  int sp = 1, sp_rank = 0;
  std::optional<dscpp::ParallelGroups> groups;  // with tensor or pipeline parallelism
};

Placement place(const Args& a, const ConfigSource& source) {
  Placement p;
  // Under `dscpp launch` (or torchrun/srun/mpirun) the engine joins the job; alone it is a single process.
  p.env = dscpp::DistEnv::from_env();
  p.device = dscpp::rank_device(a.device, p.env.local_rank);
  dscpp::make_current(p.device);  // before the model allocates anything there
  const dscpp::ParallelSizes from_file = file_layout(source);
  p.tp = layout_size(a, a.tensor_parallel, from_file.tensor, "--tensor_parallel", "tensor_parallel", "autotp_size");
  p.pp = layout_size(a, a.pipeline_parallel, from_file.pipeline, "--pipeline_parallel", "pipeline", "stages");
  p.sp = layout_size(a, a.sequence_parallel, from_file.sequence, "--sequence_parallel", "", "sequence_parallel_size");
  const dscpp::ProcessTopology topology(p.env.world_size, p.pp, p.tp);
  p.dp = topology.data();
  p.dp_rank = p.env.rank;
  if (p.sp > 1) {
    if (p.tp > 1 || p.pp > 1) {
      throw std::invalid_argument("--sequence_parallel with --tensor_parallel or --pipeline_parallel is not "
                                  "supported yet");
    }
    if (p.dp % p.sp != 0) {
      throw std::invalid_argument("--sequence_parallel " + std::to_string(p.sp) + " does not divide the world size " +
                                  std::to_string(p.env.world_size));
    }
    p.dp /= p.sp;
    p.dp_rank = p.env.rank / p.sp;
    p.sp_rank = p.env.rank % p.sp;
  }
  if (p.tp == 1 && p.pp == 1) return p;
  const std::string layout = p.tp > 1 ? "tensor parallelism (" + std::to_string(p.tp) + " ranks per model)"
                                      : "pipeline parallelism (" + std::to_string(p.pp) + " stages)";
  // Checkpoints (--save_dir, --load_dir) are parts of whole parameters, any layout; these write or read whole
  // weights from one rank's copy.
  for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--init_from", &a.init_from},
                                    {"--save_16bit", &a.save_16bit}}) {
    if (!value->empty()) {
      throw std::invalid_argument(std::string(flag) + " with " + layout + " is not supported yet: it reads or "
                                  "writes whole weights; use --save_dir and `dscpp consolidate` for the whole model");
    }
  }
  p.groups = dscpp::make_parallel_groups(
      dscpp::init_comm(p.env, dscpp::comm_backend_for(p.device, p.env.local_size)), topology);
  p.dp_rank = p.groups->data->rank();
  return p;
}

// The model and the engine that trains it: the data-parallel engine, or this rank's stage of a pipeline.
struct Trainer {
  gpt::Gpt model{nullptr};
  std::unique_ptr<dscpp::PipelineEngine> pipeline;
  std::unique_ptr<dscpp::Engine> data_parallel;
  dscpp::Engine* engine = nullptr;
  std::shared_ptr<dscpp::compression::ModelCompression> compression;  // compression_training's schedule, when on
};

// Builds the model (under ZeRO-3 partitioned as it is built) and its engine; each block then runs inside its
// run_unit and, with --activation_checkpointing, checkpointed.
Trainer build_trainer(const Args& a, const Placement& p, const dscpp::Config& config, const gpt::GptConfig& model_cfg,
                      std::function<void(const std::string&)> log) {
  const auto moe = moe_settings(a, p.tp, p.pp);
  dscpp::InitOptions init;
  init.log = std::move(log);
  if (p.groups && p.pp == 1) {  // a pipeline's engine takes its groups from PipelineEngine
    init.comm = p.groups->data;
    init.model_parallel_group = p.groups->model;
    init.world_group = p.groups->world;
  }
  // Sequence parallelism: the engine's group is every rank; the sequence groups are its consecutive runs of sp.
  std::shared_ptr<dscpp::Comm> sequence_group;
  if (p.sp > 1) {
    init.comm = dscpp::init_comm(p.env, dscpp::comm_backend_for(p.device, p.env.local_size));
    sequence_group = init.comm->split(p.env.rank / p.sp, p.env.rank);
  }
  // Expert parallelism: the expert-parallel group carries the tokens (the model's), the expert-data-parallel group
  // averages the experts' gradients (the engine's); both are cut from the data-parallel group.
  gpt::MoeSettings moe_parallel = moe;
  if (moe.ep_size > 1) {
    if (!init.comm) init.comm = dscpp::init_comm(p.env, dscpp::comm_backend_for(p.device, p.env.local_size));
    const auto experts = dscpp::moe::make_expert_groups(init.comm, moe.ep_size);
    moe_parallel.ep_group = experts.expert_parallel;
    init.expert_data_parallel_group = experts.expert_data_parallel;
  }
  if (!config.optimizer) {
    init.client_optimizer = hf_trainer_adamw(a);
    if (p.env.rank == 0) {
      std::cerr << "[gpt-train] the config has no \"optimizer\" section: training with AdamW(lr " << a.autos.lr
                << ", weight_decay " << a.autos.weight_decay << ", betas (0.9, 0.999), eps 1e-8) from --lr and "
                << "--weight_decay, as the HF Trainer builds it" << std::endl;
    }
  }
  // Under ZeRO-3 each block is a gather unit. Built partitioned, every rank keeps only its shard of each block
  // as soon as the block exists, so no rank ever holds the whole model (as HF builds under ZeRO-3). A pipeline
  // refuses ZeRO-3 (PipelineEngine says why), and so does the engine with expert parallelism.
  gpt::GptImpl::BlockBuilt block_built;
  if (config.zero.stage == 3 && a.zero_init && p.pp == 1 && moe.ep_size == 1) {
    init.partitioned = std::make_shared<dscpp::PartitionedInit>(config, init.comm, p.device);  // shards on device
    block_built = [zero_init = init.partitioned](std::shared_ptr<torch::nn::Module> block) {
      zero_init->partition(block);
    };
  }
  torch::manual_seed(a.seed);
  Trainer t;
  t.model = gpt::Gpt(model_cfg, block_built, p.groups ? p.groups->model : nullptr, moe_parallel);
  auto& model = t.model;
  model->set_sequence_group(sequence_group);
  if (a.tiled_loss > 0 && p.pp > 1) {
    throw std::invalid_argument("--tiled_loss with pipeline parallelism is not supported yet");
  }
  model->set_tiled_loss(a.tiled_loss);
  if (config.sparse_attention) model->set_sparse_attention(*config.sparse_attention, a.seed);
  init.sparse_attention_applied = config.sparse_attention.has_value();
  init.model_parallel_slices = model->tensor_parallel_slices();
  if (init.partitioned) {
    // The blocks are already there, as shards; moving them again would copy nothing but their empty storages.
    for (auto& child : model->named_children()) {
      if (child.key() != "h") child.value()->to(p.device);
    }
  } else {
    model->to(p.device);
  }
  if (!init.partitioned && p.pp == 1) {
    for (const auto& block : model->blocks()) init.gather_units.push_back(block.ptr());
  }
  // DeepSpeed Compression of the blocks' linear layers, set up from the whole weights (as Python's init_compression).
  t.compression = gpt::compress(model, config,
                                {p.pp > 1, p.sp > 1, init.partitioned != nullptr, !a.init_from.empty(),
                                 a.activation_checkpointing},
                                init.log);
  init.compression_applied = t.compression != nullptr;
  // Pipelined, every rank builds the whole model (the same values at every layout) and keeps its stage's layers;
  // the other layers' parameters are released. With --activation_checkpointing each block is checkpointed, as
  // without a pipeline (pipeline.activation_checkpoint_interval 1 unless the config sets one).
  if (p.pp > 1) {
    auto pipe_config = config;
    if (a.activation_checkpointing && pipe_config.pipeline.activation_checkpoint_interval == 0) {
      pipe_config.pipeline.activation_checkpoint_interval = 1;
    }
    t.pipeline = std::make_unique<dscpp::PipelineEngine>(gpt::pipeline_model(model), pipe_config, *p.groups, init);
    std::set<const c10::TensorImpl*> kept;
    for (const auto& param : t.pipeline->module()->parameters()) kept.insert(param.unsafeGetTensorImpl());
    torch::NoGradGuard no_grad;
    for (auto& param : model->parameters()) {
      if (!kept.count(param.unsafeGetTensorImpl())) param.set_data(torch::empty({0}, param.options()));
    }
    // Dropout: stage s draws from a generator seeded --seed + 100·s from here on (Megatron's rule; the same on
    // every data- and tensor-parallel rank of the stage), so a pipelined run is reproducible, but its masks are not
    // the ones one process would draw: that process draws every layer from one generator in turn.
    torch::manual_seed(a.seed + 100 * static_cast<uint64_t>(p.groups->coord.pipe));
    t.engine = &t.pipeline->engine();
  } else {
    t.data_parallel = dscpp::initialize(model.ptr(), config, init);
    t.engine = t.data_parallel.get();
  }
  // Each block inside its run_unit (ZeRO-3 gathers its parameters there, also for a recompute in backward) and,
  // with --activation_checkpointing, checkpointed: the block holds itself in the closure, which backward calls again.
  // An MoE block's load-balancing loss leaves the checkpoint beside its output, so that its gradient reaches the gate
  // through the recompute (the checkpointed forward itself runs without autograd); the recompute draws the forward's
  // random numbers again (RTS, Jitter, 2nd-expert sampling), so it routes the same tokens.
  model->set_block_runner([engine = t.engine, checkpoint = a.activation_checkpointing](const gpt::Block& block,
                                                                                    const torch::Tensor& x) {
    return engine->run_unit(*block, [&] {
      const auto unit = block.ptr();
      if (!checkpoint) return unit->forward(x);
      if (!unit->moe) return engine->checkpoint([unit](const torch::Tensor& input) { return unit->forward(input); }, x);
      const auto outputs = engine->checkpoint(
          dscpp::ActivationCheckpointing::ListBlock([unit](const std::vector<torch::Tensor>& inputs) {
            auto output = unit->forward(inputs[0]);
            return std::vector<torch::Tensor>{output, unit->l_aux};
          }),
          std::vector<torch::Tensor>{x});
      unit->l_aux = outputs[1];
      return outputs[0];
    });
  });
  return t;
}

// One optimizer step: gradient_accumulation_steps micro-batches of forward, backward and step (a pipeline runs
// them in its 1F1B schedule).
void train_step(Trainer& t, int64_t grad_accum, const std::function<dscpp::MicroBatch(int64_t)>& micro_batch) {
  if (t.pipeline) {
    t.pipeline->train_batch([&](int micro) { return micro_batch(micro); });
    return;
  }
  for (int64_t micro = 0; micro < grad_accum; ++micro) {
    const auto rows = micro_batch(micro);
    if (t.compression && t.engine->global_steps() == 0) t.compression->on_forward();  // DeepSpeed's step-zero check
    auto loss = t.engine->forward([&] { return t.model->loss(rows.inputs, rows.labels); });
    t.engine->backward(loss);
    if (t.engine->step() && t.compression) {
      t.compression->on_step(t.engine->global_steps() - t.engine->skipped_steps());
    }
  }
}

// A pipeline stage's statistics over the steps after the first (warm-up), and one rank's of them as they travel to
// rank 0.
struct PipelineTotals {
  int64_t stage = 0, replica = 0;  // the stage and which model-parallel replica (data × tensor coordinate)
  double idle_s = 0, batch_s = 0;
  int64_t peak_in_flight = 0, activation_peak = -1;

  void add(const dscpp::PipeStepStats& stats, bool timed) {
    if (timed) idle_s += stats.idle_s, batch_s += stats.batch_s;
    peak_in_flight = std::max<int64_t>(peak_in_flight, stats.peak_in_flight);
    activation_peak = std::max(activation_peak, stats.activation_peak);
  }
  static constexpr size_t kPacked = 6;
  std::vector<int64_t> pack() const {
    return {stage, replica, static_cast<int64_t>(idle_s * 1e6), static_cast<int64_t>(batch_s * 1e6), peak_in_flight,
            activation_peak};
  }
  static PipelineTotals unpack(const int64_t* v) {
    return {v[0], v[1], static_cast<double>(v[2]) * 1e-6, static_cast<double>(v[3]) * 1e-6, v[4], v[5]};
  }
};

// Every rank's totals to rank 0 (through the store: no collective on the process group), one line per stage of the
// first replica.
void report_pipeline(PipelineTotals mine, const Placement& p, int64_t grad_accum) {
  const auto& coord = p.groups->coord;
  mine.stage = coord.pipe;
  mine.replica = coord.data * p.tp + coord.model;
  const auto all = p.groups->world->side_all_gather(mine.pack());
  for (int r = 0; p.env.rank == 0 && r < p.env.world_size; ++r) {
    const auto s = PipelineTotals::unpack(&all[PipelineTotals::kPacked * r]);
    if (s.replica != 0) continue;
    std::cerr << "[gpt-train] pipeline stage " << s.stage << ": idle " << std::fixed << std::setprecision(3)
              << (s.batch_s > 0 ? s.idle_s / s.batch_s : 0.0) << " of its step time (1F1B bubble "
              << dscpp::bubble_fraction(p.pp, static_cast<int>(grad_accum)) << "), at most " << s.peak_in_flight
              << " micro-batches in flight, activation peak "
              << (s.activation_peak < 0 ? std::string("n/a") : std::to_string(s.activation_peak / 1024) + " KiB")
              << std::defaultfloat << std::endl;
  }
}

// How fast one step went.
struct StepSpeed {
  double step_ms = 0, tokens_per_s = 0, model_flops_per_s = 0;
};

// One --metrics line: the step's report, its speed, memory (`ranks_memory`: every rank's breakdown, with
// memory_breakdown on) and the swap and gather counters.
void write_metrics(dscpp::MetricsJsonl& metrics, const Args& a, const Trainer& t, const dscpp::Config& config,
                   int world_size, const StepSpeed& speed, const std::vector<dscpp::MemoryBreakdown>& ranks_memory) {
  const auto& r = t.engine->last_step();
  nlohmann::json memory_ranks = nlohmann::json::array();
  for (const auto& m : ranks_memory) memory_ranks.push_back(dscpp::to_json(m));
  const auto timers = t.engine->stage_timers();
  metrics.write({{"step", r.step}, {"loss", r.loss}, {"lr", r.lr}, {"loss_scale", r.loss_scale},
                 {"grad_norm", r.grad_norm}, {"skipped", r.skipped}, {"step_ms", speed.step_ms},
                 {"tokens_per_s", speed.tokens_per_s}, {"model_flops_per_s", speed.model_flops_per_s},
                 {"mfu", a.peak_tflops ? nlohmann::json(speed.model_flops_per_s / (*a.peak_tflops * 1e12)) : nullptr},
                 {"world_size", world_size},
                 {"memory", dscpp::to_json(t.engine->memory())}, {"rss_bytes", dscpp::resident_bytes()},
                 {"peak_rss_bytes", dscpp::peak_resident_bytes()},
                 {"open_fds", dscpp::open_file_descriptors()}, {"swap_file_bytes", swap_file_bytes(config)},
                 {"gathers", timers.gathers}, {"gather_wait_s", timers.gather_wait_s},
                 {"moe_all_to_all_s", t.model->moe_all_to_all_seconds()},
                 {"param_swap", swap_json(timers.param_swap)},
                 {"optimizer_swap", swap_json(t.engine->optimizer_swap())},
                 {"wall_clock_s", times_json(r.times)},
                 {"memory_breakdown", dscpp::to_json(t.engine->memory_breakdown())},
                 {"memory_ranks", memory_ranks}});
}

// The last line: steps, loss, and MFU against the measured (or given) peak and the CPU's SIMD peak.
void print_summary(const Args& a, const dscpp::Engine& engine, const torch::Device& device, double flops_per_s_sum,
                   int64_t timed_steps) {
  std::cerr << "[gpt-train] done: " << engine.global_steps() << " steps, final loss " << engine.last_step().loss
            << ", skipped " << engine.skipped_steps();
  if (timed_steps > 0) {
    const double peak_flops = a.peak_tflops ? *a.peak_tflops * 1e12
                                            : dscpp::measure_peak_flops(engine.compute_dtype(), device);
    std::cerr << "; MFU " << std::fixed << std::setprecision(1) << 100.0 * flops_per_s_sum / timed_steps / peak_flops
              << "% of " << dscpp::format_flops(peak_flops, "FLOP/s") << " per rank"
              << (a.peak_tflops ? "" : " (measured)");
    // Against the silicon as well: the measured peak is LibTorch's best matmul here, not the vector units' limit.
    const auto simd = device.is_cpu() ? dscpp::cpu_peak_flops(engine.compute_dtype()) : dscpp::CpuPeak{};
    if (simd.flops > 0) {
      std::cerr << ", " << 100.0 * flops_per_s_sum / timed_steps / simd.flops << "% of the CPU's SIMD peak "
                << dscpp::format_flops(simd.flops, "FLOP/s") << " (" << simd.how << ")";
    }
  }
  std::cerr << std::endl;
}

int run(const Args& a) {
  // Counts what CPU tensors hold, so the metrics can say how much memory activations took (RSS cannot).
  dscpp::CpuMemoryTracker::install();
  const ConfigSource source = read_config(a);
  const Placement p = place(a, source);
  const int rank = p.env.rank;
  auto dataset = std::make_shared<const gpt::TokenDataset>(a.data.empty() ? gpt::TokenDataset::default_corpus()
                                                                          : gpt::TokenDataset::from_file(a.data));
  const auto model_cfg = model_config(a, dataset->vocab_size());
  // 128 by default keeps the no-argument run to a minute or two on two cores; any length up to the block works.
  const int64_t seq_len = a.seq_len.value_or(std::min<int64_t>(model_cfg.block_size, 128));
  if (seq_len < 1 || seq_len > model_cfg.block_size) {
    throw std::invalid_argument("--seq_len " + std::to_string(seq_len) + " must be in [1, block_size " +
                                std::to_string(model_cfg.block_size) + "]");
  }
  if (seq_len % p.sp != 0) {
    throw std::invalid_argument("--seq_len " + std::to_string(seq_len) + " does not split over --sequence_parallel " +
                                std::to_string(p.sp) + " ranks");
  }
  const auto config = load_config(a, source, p.dp, model_cfg.n_embd);
  gpt::check_generation(a.generation, p.pp, p.sp, config.sparse_attention.has_value(), *dataset, model_cfg);
  gpt::ProgressBar progress(a.steps, !a.no_progress && rank == 0);
  Trainer t = build_trainer(a, p, config, model_cfg, [&progress, rank](const std::string& line) {
    if (rank != 0) return;
    progress.clear();
    std::cerr << line << std::endl;
  });
  dscpp::Engine& engine = *t.engine;
  if (!a.init_from.empty()) init_from_hf(engine, *t.model, a.init_from, rank);  // (refused above when pipelined)
  // One command line for the first start and every restart (`--save_dir D --load_dir D`, as under
  // `dscpp launch`'s supervisor): a D that holds no checkpoint yet starts from step 0, and says so.
  if (!a.load_dir.empty() && a.load_tag.empty() && dscpp::holds_no_checkpoint(a.load_dir)) {
    if (rank == 0) {
      std::cerr << "[gpt-train] --load_dir " << a.load_dir << " holds no checkpoint yet: starting from step 0"
                << std::endl;
    }
  } else if (!a.load_dir.empty()) {
    engine.load_checkpoint(a.load_dir, a.load_tag);
    if (t.compression) t.compression->resume(engine.global_steps() - engine.skipped_steps());
  }
  // Saved with every checkpoint, so `dscpp consolidate --format hf-gpt2` can write HF's config.json.
  const nlohmann::json client_state = {
      {"gpt2",
       {{"vocab_size", model_cfg.vocab_size}, {"block_size", model_cfg.block_size}, {"n_embd", model_cfg.n_embd},
        {"n_layer", model_cfg.n_layer}, {"n_head", model_cfg.n_head}, {"layer_norm_eps", model_cfg.layer_norm_eps}}}};

  gpt::BatchSamplerOptions sampling;
  sampling.seq_len = seq_len;
  sampling.order = a.data_order == "shuffled" ? gpt::DataOrder::kShuffled : gpt::DataOrder::kSequential;
  sampling.seed = a.seed;
  const gpt::BatchSampler sampler(dataset, sampling);
  const auto& batch = config.batch;
  const int64_t rank_rows = batch.train_batch_size / p.dp;
  if (rank == 0) {
    std::cerr << "[gpt-train] " << dataset->description() << "; model " << a.model << " (" << model_cfg.num_params()
              << " params, " << model_cfg.n_layer << " layers, " << model_cfg.n_embd << " wide), seq " << seq_len
              << "; global batch " << batch.train_batch_size << " = micro " << batch.micro_batch << " × accum "
              << batch.grad_accum << " × data parallel " << p.dp << "; " << dscpp::to_string(config.compute_dtype())
              << "; ZeRO stage " << config.zero.stage;
    if (p.tp > 1) std::cerr << "; tensor parallel " << p.tp;
    if (p.pp > 1) std::cerr << "; pipeline parallel " << p.pp;
    if (p.sp > 1) std::cerr << "; sequence parallel " << p.sp << " (" << seq_len / p.sp << " positions per rank)";
    if (p.tp > 1 || p.pp > 1 || p.sp > 1) std::cerr << " (world " << p.env.world_size << ")";
    std::cerr << std::endl;
  }

  // MFU: the model's training FLOPs per rank and step (3 × the forward's matrix products; recomputation is not
  // model work) per second, over the rank's peak. The peak is measured once, after training, unless given.
  const double step_flops =
      3.0 * static_cast<double>(model_cfg.forward_flops(seq_len)) * rank_rows / (p.tp * p.pp * p.sp);
  double flops_per_s_sum = 0;
  int64_t timed_steps = 0;
  PipelineTotals pipeline_totals;
  std::optional<dscpp::MetricsJsonl> metrics;
  if (!a.metrics.empty() && rank == 0) metrics.emplace(a.metrics);

  for (int64_t step = engine.global_steps(); step < a.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    train_step(t, batch.grad_accum, [&](int64_t micro) {
      const auto rows = sampler.rows(step, batch.train_batch_size, p.dp_rank * rank_rows + micro * batch.micro_batch,
                                     batch.micro_batch);
      // Sequence parallel: this rank's part of every sequence (its sequence group read the same rows).
      const auto part = [&](const torch::Tensor& t) { return p.sp > 1 ? t.chunk(p.sp, 1)[p.sp_rank] : t; };
      return dscpp::MicroBatch{part(rows.inputs).to(p.device), part(rows.targets).to(p.device)};
    });
    StepSpeed speed;
    speed.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    speed.tokens_per_s = batch.train_batch_size * seq_len / (speed.step_ms / 1000.0);
    speed.model_flops_per_s = step_flops / (speed.step_ms / 1000.0);
    if (t.pipeline) pipeline_totals.add(t.pipeline->last_stats(), /*timed=*/step > 0);
    progress.update(engine.last_step().step, engine.last_step().loss, speed.tokens_per_s);
    if (step > 0) flops_per_s_sum += speed.model_flops_per_s, ++timed_steps;  // the first step pays for warm-up
    // With memory_breakdown on, the metrics carry every rank's breakdown: an exchange every rank joins.
    std::vector<dscpp::MemoryBreakdown> ranks_memory;
    if (!a.metrics.empty() && config.memory_breakdown) ranks_memory = engine.memory_breakdown_all_ranks();
    if (metrics) write_metrics(*metrics, a, t, config, p.env.world_size, speed, ranks_memory);
    const int64_t done = engine.global_steps();
    if (!a.save_dir.empty() && ((a.save_interval > 0 && done % a.save_interval == 0) || done == a.steps)) {
      engine.save_checkpoint(a.save_dir, "", client_state);
    }
  }
  progress.finish();
  if (t.pipeline) report_pipeline(pipeline_totals, p, batch.grad_accum);
  if (!a.save_16bit.empty() && engine.save_16bit_model(a.save_16bit) && rank == 0) {
    std::cerr << "[gpt-train] wrote " << a.save_16bit << std::endl;
  }
  if (rank == 0) print_summary(a, engine, p.device, flops_per_s_sum, timed_steps);
  if (!a.generation.prompt.empty()) gpt::generate_text(a.generation, a.seed, *t.model, engine, rank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpt-train: train a GPT-2-style decoder with deepspeed.cpp"};
  Args args;
  add_flags(app, args);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "gpt-train: error: " << e.what() << std::endl;
    return 1;
  }
}
