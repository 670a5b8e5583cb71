#!/usr/bin/env bash
# ZeRO-Infinity scale demonstration: trains a GPT whose model states do not fit in this machine's RAM — by default
# 3.05B parameters (32 blocks × 2816 wide, byte vocabulary), bf16 with Adam: 16 bytes per parameter, 48.8 GB — on
# one process. The model is built partitioned (ZeRO-3's zero.Init: no whole copy ever exists), its 16-bit parameters
# and its fp32 master + Adam state live in swap files under NVME_DIR (43 GB; removed at the end); RAM holds the fp32
# gradient partition, the blocks being computed and the swap buffers. The batch is 8 × 32 tokens (one step's loss
# over fewer tokens is too noisy to show a trend in a few steps) and the learning rate warms up over the first 2
# steps (DeepSpeed's WarmupLR, linear from 1e-6 to 2e-6: the first update is the one that jars) and then stays at 2e-6:
# Adam's first steps move every weight by about lr in the sign of its gradient, and at this width (2816) with GPT-2's
# 0.02 init that reshapes the residual stream at once — plain PyTorch and the engine alike (equal losses) jumped from
# 5.35 to 21.1 in one step at 1e-4 on a 3-block cut, spiked at 1e-5, and fell smoothly at 3e-6 (3 blocks: 5.35 →
# 3.8–3.9 in 7 steps; 8 blocks: 5.34 → 4.1 in 4); the 32-block one, deeper still, gets 2e-6 (at a constant 2e-6 its
# loss went 5.42, 5.64, 4.12, 4.01, 3.81 in bench/RESULTS.md of 609c537). WARMUP=0 gives the constant rate; WARMUP=N
# warms up from WARMUP_MIN_LR (default LR/2) over N steps. Prints per step the time split into compute and I/O wait,
# the bytes moved and the loss, whether the loss fell, then peak RSS and the bytes on disk.
# Then the baseline: the largest model of the same width that a plain PyTorch loop (bench/python_loop on the same
# LibTorch, fp32 + AdamW one tensor at a time: the leanest plain loop) trains here without offload — by arithmetic:
# the loop's peak RSS measured at 1 and 2 blocks gives the bytes one block costs, the depth that fits MemAvailable
# follows, and one run at that depth under a memory limit (prlimit --as) confirms it. The demo's model is printed as a
# multiple of it. PLAIN=0 skips it.
# Memory: the demo's process is limited to MemAvailable + 2 GiB of address space (it maps ~2 GB it never touches:
# libraries, thread stacks; measured VmPeak 23.1 GB against a peak RSS of 21.1 GB), so that outgrowing the machine ends in an error, not the OOM killer.
# Expected time on a 2-core machine (defaults): ~24 min — gpt-train ~18.5 (initialize and 4 steps of 3.2–3.8 min: 1104
# s in bench/RESULTS.md of 555eae1, 23:52 in all), the plain baseline's probes and confirming run ~5.
#
#   [LR=2e-6] [WARMUP=2] [WARMUP_MIN_LR=LR/2] [BATCH=8] [PLAIN=1] bench/scale_demo/run.sh [BUILD_DIR] [NVME_DIR] [STEPS] [N_LAYER] [N_EMBD]
set -euo pipefail
build=${1:-build}
PYTHON=${PYTHON:-$(sed -n 's/^DSCPP_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)}  # the build's torch
nvme_root=${2:-/tmp/dscpp_scale}
steps=${3:-4}
n_layer=${4:-32}
n_embd=${5:-2816}
n_head=$((n_embd / 128))
lr=${LR:-2e-6}
warmup=${WARMUP:-2}
warmup_min_lr=${WARMUP_MIN_LR:-$(awk -v lr="$lr" 'BEGIN { print lr / 2 }')}
batch=${BATCH:-8}
mkdir -p "$nvme_root"
nvme=$(mktemp -d "$nvme_root/run.XXXXXX")
trap 'rm -rf "$nvme"' EXIT
GiB=$((1 << 30))
avail() { awk '/MemAvailable/ { printf "%.0f\n", $2 * 1024 }' /proc/meminfo; }
config="$nvme/scale_config.json"
scheduler=""
[ "$warmup" -eq 0 ] || scheduler='
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": '"$warmup_min_lr"', "warmup_max_lr": '"$lr"',
   "warmup_num_steps": '"$warmup"', "warmup_type": "linear"}},'
cat > "$config" <<JSON
{"train_batch_size": $batch, "steps_per_print": 1, "bf16": {"enabled": true}, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": $lr, "weight_decay": 0.1}},$scheduler
 "zero_optimization": {"stage": 3, "sub_group_size": 50000000, "overlap_comm": true,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$nvme", "buffer_count": 4},
   "offload_param": {"device": "nvme", "nvme_path": "$nvme", "buffer_count": 5}},
 "aio": {"block_size": 1048576, "queue_depth": 8}}
JSON
# Parameters: V·C + P·C + L·(12C² + 13C) + 2C, the model's closed form (V = 256 bytes, P = 1024 positions).
count() { echo $(( 256 * $2 + 1024 * $2 + $1 * (12 * $2 * $2 + 13 * $2) + 2 * $2 )); }
params=$(count "$n_layer" "$n_embd")
echo "scale_demo: $params parameters, swap files under $nvme ($(df -h --output=avail "$nvme" | tail -1 | tr -d ' ') free)," \
  "batch $batch x 32 tokens, lr $lr (warmup: $warmup steps from $warmup_min_lr), $steps steps"
start=$(date +%s)
as_limit=$(( $(avail) + 2 * GiB ))
OMP_NUM_THREADS=$(nproc) prlimit --as="$as_limit" -- "$build/gpt-train" --no_progress --model gpt2-xl \
  --n_layer "$n_layer" --n_embd "$n_embd" --n_head "$n_head" --seq_len 32 --steps "$steps" --deepspeed_config "$config" --metrics "$nvme/metrics.jsonl"
echo "gpt-train: $(( $(date +%s) - start )) s in all (initialize and $steps steps)"
"$build/bench/bench_scale_summary" "$nvme/metrics.jsonl" "$params"
rm -rf "${nvme:?}"/*  # the swap files: the baseline needs the page cache they hold

[ "${PLAIN:-1}" = 1 ] || exit 0
# The plain loop: PyTorch's own modules in fp32 (weights, gradients, Adam's two moments: 16 bytes per parameter and
# the activations), trained for 2 steps at the demo's batch; prints "peak-RSS peak-address-space" in bytes.
plain_run() {  # DEPTH [prlimit args...]
  local depth=$1
  shift
  "$@" env OMP_NUM_THREADS="$(nproc)" "$PYTHON" "$(dirname "$0")/../python_loop/gpt_loop.py" --model gpt2-xl \
    --no_foreach --n_layer "$depth" --n_embd "$n_embd" --n_head "$n_head" --seq_len 32 --micro_batch "$batch" \
    --steps 2 --lr "$lr" --metrics "$nvme/plain$depth.jsonl" >"$nvme/plain$depth.log" 2>&1 || return 1
  python3 -c 'import json, sys; m = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(m["peak_rss_bytes"], m["vm_peak_bytes"])' "$nvme/plain$depth.jsonl"
}
read -r rss1 vm1 < <(plain_run 1) || { echo "the plain loop failed at 1 block:"; tail -5 "$nvme/plain1.log"; exit 1; }
read -r rss2 _ < <(plain_run 2) || { echo "the plain loop failed at 2 blocks:"; tail -5 "$nvme/plain2.log"; exit 1; }
per_layer_params=$(( 12 * n_embd * n_embd + 13 * n_embd ))
block_bytes=$(( rss2 - rss1 ))
budget=$(( $(avail) - GiB / 2 ))  # half a GiB left to the kernel and the page cache's working set
plain_layers=$(( (budget - rss1) / block_bytes + 1 ))
plain=$(count "$plain_layers" "$n_embd")
awk -v r1="$rss1" -v b="$block_bytes" -v p="$per_layer_params" -v budget="$budget" -v l="$plain_layers" \
    -v params="$plain" 'BEGIN {
  printf "plain PyTorch loop (fp32, AdamW per tensor), measured: peak RSS %.2f GB at 1 block; each block adds %.3f GB =" \
         " %.1f bytes per parameter\n", r1 / 1e9, b / 1e9, b / p
  printf "  fits MemAvailable less 0.5 GiB (%.2f GB): %d blocks, %.3f B parameters, predicted peak RSS %.2f GB\n",
         budget / 1e9, l, params / 1e9, (r1 + (l - 1) * b) / 1e9 }'
if [ "$plain_layers" -lt 1 ]; then echo "no plain model of width $n_embd fits here"; exit 0; fi
# The confirming run may use what the machine has, plus the address space the 1-block run mapped and never touched.
limit=$(( $(avail) + vm1 - rss1 ))
if read -r rss _ < <(plain_run "$plain_layers" prlimit --as="$limit" --); then
  awk -v p="$plain" -v big="$params" -v rss="$rss" -v l="$limit" 'BEGIN {
    printf "  confirmed: 2 steps trained under prlimit --as=%.2f GB, peak RSS %.2f GB\n", l / 1e9, rss / 1e9
    printf "largest plain PyTorch model here: %.3f B parameters; the offloaded model is %.2fx it\n", p / 1e9, big / p }'
else
  echo "  NOT confirmed: the run at $plain_layers blocks failed under prlimit --as=$limit:"
  tail -3 "$nvme/plain$plain_layers.log"
  exit 1
fi
