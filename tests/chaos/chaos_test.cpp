// Chaos (issue 20): gpt-train jobs of 2-4 ranks under `dscpp launch`, ZeRO 1-3, one rank SIGKILLed at a chosen
// moment through DSCPP_KILL_AT — in forward, backward, the optimizer step, a collective, an NVMe swap, a checkpoint
// save. Every run asserts what a user's job needs after a machine fault:
//   - the launcher exits non-zero, well within the comm timeout + 10 s (no hang), and no process of the job is left;
//   - the last complete checkpoint loads and verifies (`dscpp consolidate` reads every tensor, checking its CRC);
//   - the same command with --max_restarts continues from it and ends with the final weights of the run that was
//     never killed, bitwise.
// The default binary runs one kill of each kind; the long one (label long) 100 drawn at random from a fixed seed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>

#include "../common/multiprocess.h"
#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/fault/kill_point.h"

namespace dscpp::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kSteps = 6;
constexpr int kSaveInterval = 2;
constexpr int kCommTimeoutMinutes = 1;  // DEEPSPEED_TIMEOUT: a collective whose peer died fails within this

struct Chaos {
  int world = 2;
  int stage = 1;
  bool nvme = false;  // stage 3 with the optimizer state swapped to NVMe
  std::string point;
  long long hit = 1;
  int rank = 0;
  std::string name() const {
    std::string p = point;
    for (char& c : p) if (c == '.') c = '_';
    return "w" + std::to_string(world) + "s" + std::to_string(stage) + (nvme ? "nvme" : "") + "_" + p + "_" +
           std::to_string(hit) + "_r" + std::to_string(rank);
  }
  std::string kill_at() const { return point + "@" + std::to_string(hit) + ",rank=" + std::to_string(rank); }
};

std::string write_config(const fs::path& dir, const Chaos& c) {
  nlohmann::json zero = {{"stage", c.stage}, {"reduce_bucket_size", 30011}, {"overlap_comm", true}};
  if (c.stage == 3) {
    zero["stage3_param_persistence_threshold"] = 20'000;
    zero["stage3_gather_16bit_weights_on_model_save"] = true;
  }
  if (c.nvme) {
    fs::create_directories(dir / "nvme");
    zero["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", (dir / "nvme").string()}};
    zero["sub_group_size"] = 7'001;
  }
  // 12 rows: whole micro-batches on 2, 3 and 4 ranks.
  const nlohmann::json config = {{"train_batch_size", 12},
                                 {"steps_per_print", 1000},
                                 {"gradient_clipping", 1.0},
                                 {"zero_optimization", zero},
                                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.1}}}}}};
  const auto path = dir / "ds.json";
  std::ofstream(path) << config.dump();
  return path.string();
}

// The job, as a user would start it: one command line for the first start and every restart. `job_id` is put in
// every process's environment, so the test can find any process of the job that outlives its launcher.
std::string job_command(const Chaos& c, const fs::path& dir, const std::string& job_id, const std::string& kill_at,
                        const std::string& launch_flags, const fs::path& weights) {
  return "DSCPP_CHAOS_JOB=" + job_id + " OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=" +
         std::to_string(kCommTimeoutMinutes) + (kill_at.empty() ? "" : " DSCPP_KILL_AT=" + kill_at) +
         // An outer bound only so that a hang fails this test instead of the whole suite's timeout.
         " timeout 600 " + DSCPP_BINARY_DIR + "/dscpp launch --num_gpus " + std::to_string(c.world) +
         " --master_port " + std::to_string(free_port()) + " " + launch_flags + " " + DSCPP_BINARY_DIR +
         "/gpt-train --no_progress --model tiny --seq_len 32 --data_order shuffled --peak_tflops 1 --deepspeed_config " +
         write_config(dir, c) + " --steps " + std::to_string(kSteps) + " --save_dir " + (dir / "ckpt").string() +
         " --load_dir " + (dir / "ckpt").string() + " --save_interval " + std::to_string(kSaveInterval) +
         " --save_16bit " + weights.string();
}

// The final weights of the run that is never killed, one per layout (computed once).
const std::string& uninterrupted_weights(const Chaos& c) {
  static std::map<std::string, std::string> cache;
  Chaos layout = c;
  layout.point = "none", layout.hit = 0, layout.rank = 0;
  const std::string key = layout.name();
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto dir = temp_dir("chaos_reference_" + key);
    const auto run = run_command(job_command(c, dir, "reference", "", "", dir / "final.st"));
    EXPECT_EQ(run.code, 0) << run.err;
    it = cache.emplace(key, read_text(dir / "final.st")).first;
  }
  return it->second;
}

// Live (not zombie) processes whose environment holds DSCPP_CHAOS_JOB=`job_id`.
std::vector<std::string> processes_of(const std::string& job_id) {
  const std::string marker = "DSCPP_CHAOS_JOB=" + job_id;
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string environ = read_text(entry.path() / "environ");
    std::istringstream vars(environ);
    bool ours = false;
    for (std::string var; std::getline(vars, var, '\0');) ours = ours || var == marker;
    if (!ours) continue;
    const std::string stat = read_text(entry.path() / "stat");  // "pid (comm) state ..."
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z') found.push_back(stat);
  }
  return found;
}

struct Outcome {
  bool killed = false, hung = false, lost_checkpoint = false, restart_bitwise = false;
};

Outcome run_chaos(const Chaos& c) {
  SCOPED_TRACE(c.name() + " (DSCPP_KILL_AT=" + c.kill_at() + ")");
  Outcome outcome;
  const std::string& want = uninterrupted_weights(c);
  EXPECT_FALSE(want.empty());
  const auto dir = temp_dir("chaos_" + c.name());
  const std::string job_id = c.name() + "_" + std::to_string(::getpid());

  // 1. Killed: the launcher reports the failure, stops the other ranks and leaves nothing behind.
  const auto start = Clock::now();
  const auto killed = run_command(job_command(c, dir, job_id, c.kill_at(), "", dir / "killed.st"));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  outcome.killed = killed.code != 0 && killed.code != 124;
  outcome.hung = killed.code == 124 || seconds > kCommTimeoutMinutes * 60 + 10;
  EXPECT_TRUE(outcome.killed) << "exit " << killed.code << ": the kill point was not reached?\n" << killed.err;
  EXPECT_FALSE(outcome.hung) << seconds << " s\n" << killed.err;
  EXPECT_NE(killed.err.find("was killed by signal 9"), std::string::npos) << killed.err;
  EXPECT_EQ(processes_of(job_id), std::vector<std::string>{});

  // 2. The last complete checkpoint (if the job got as far as one) loads, every tensor's checksum verified.
  const auto ckpt = dir / "ckpt";
  if (!holds_no_checkpoint(ckpt.string())) {
    const auto verify = run_command(std::string(DSCPP_BINARY_DIR) + "/dscpp consolidate " + ckpt.string() + " " +
                                    (dir / "verified").string());
    outcome.lost_checkpoint = verify.code != 0;
    EXPECT_EQ(verify.code, 0) << verify.err;
  }

  // 3. The same command under --max_restarts, the same fault armed for its first start: it ends as if never killed.
  const auto restarted = run_command(job_command(c, dir, job_id, c.kill_at(), "--max_restarts 2", dir / "final.st"));
  EXPECT_EQ(restarted.code, 0) << restarted.err;
  const std::string got = read_text(dir / "final.st");
  outcome.restart_bitwise = restarted.code == 0 && !got.empty() && got == want;
  EXPECT_TRUE(outcome.restart_bitwise) << "the restarted job's final weights differ from the uninterrupted run's";
  EXPECT_EQ(processes_of(job_id), std::vector<std::string>{});
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
  return outcome;
}

void PrintTo(const Chaos& chaos, std::ostream* os) { *os << chaos.name(); }  // not its bytes (ctest, failures)

class ChaosSample : public ::testing::TestWithParam<Chaos> {};

TEST_P(ChaosSample, KilledRankStopsTheJobAndARestartEndsBitwise) { run_chaos(GetParam()); }

// One kill of each kind, on each stage and world size. Hits are within what every layout passes in its 6 steps
// (measured: ranks at stages 1-2 pass 321 collectives, at stage 3 103; stage 3 with NVMe over 1,600 swap
// transfers).
INSTANTIATE_TEST_SUITE_P(
    EveryKind, ChaosSample,
    ::testing::Values(Chaos{2, 1, false, "engine.forward", 4, 1}, Chaos{3, 2, false, "engine.backward", 3, 2},
                      Chaos{2, 3, false, "engine.step", 5, 0}, Chaos{4, 2, false, "comm.collective", 200, 3},
                      Chaos{2, 3, true, "swap.io", 300, 1},
                      Chaos{3, 1, false, "checkpoint.shard_half_written", 2, 1},
                      // The first save killed after publishing its tag, before `latest` names it.
                      Chaos{2, 2, false, "checkpoint.published", 1, 0}),
    [](const auto& info) { return info.param.name(); });

// The long label's (LongChaos: tests/chaos/CMakeLists.txt). 100 runs drawn from a fixed seed: world 2-4, stage 1-3 (stage 3 with NVMe swapping for swap kills), any point, any
// rank (rank 0 where only rank 0 passes the point), a hit within what the layout passes.
TEST(LongChaos, HundredRandomKills) {
  std::mt19937 rng(20261126);
  auto pick = [&](long long lo, long long hi) { return std::uniform_int_distribution<long long>(lo, hi)(rng); };
  int killed = 0, hangs = 0, lost = 0, bitwise = 0;
  constexpr int kRuns = 100;
  for (int i = 0; i < kRuns; ++i) {
    Chaos c;
    c.world = static_cast<int>(pick(2, 4));
    c.stage = static_cast<int>(pick(1, 3));
    c.point = fault::kKillPoints[pick(0, static_cast<long long>(fault::kKillPoints.size()) - 1)];
    // Collectives a rank passes in the 6 steps (measured on torch 2.11, 2-4 ranks: 321 at stages 1-2, 103 at stage
    // 3, whose gathers are one all_gather each; torch 1.13's Gloo fallbacks made more of them).
    const long long collectives = c.stage == 3 ? 100 : 240;
    const std::map<std::string, long long> most = {{"engine.forward", kSteps}, {"engine.backward", kSteps},
                                                   {"engine.step", kSteps}, {"comm.collective", collectives},
                                                   {"swap.io", 400}};
    const auto bound = most.find(c.point);
    c.hit = pick(1, bound == most.end() ? kSteps / kSaveInterval : bound->second);  // checkpoint.*: one per save
    c.nvme = c.point == "swap.io";
    if (c.nvme) c.stage = 3;
    const bool rank0_only = c.point == "checkpoint.manifest_written" || c.point == "checkpoint.published";
    c.rank = rank0_only ? 0 : static_cast<int>(pick(0, c.world - 1));
    const Outcome o = run_chaos(c);
    killed += o.killed, hangs += o.hung, lost += o.lost_checkpoint, bitwise += o.restart_bitwise;
  }
  std::cout << "[chaos] " << kRuns << " runs: " << killed << " killed and survived, " << hangs << " hangs, " << lost
            << " checkpoints lost, " << bitwise << " restarts ended bitwise as the uninterrupted run" << std::endl;
  EXPECT_EQ(killed, kRuns);
  EXPECT_EQ(hangs, 0);
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(bitwise, kRuns);
}

}  // namespace
}  // namespace dscpp::testing
