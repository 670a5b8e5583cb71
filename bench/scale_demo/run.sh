#!/usr/bin/env bash
# ZeRO-Infinity scale demonstration: trains a GPT whose model states do not fit in this machine's RAM — by default
# 3.05B parameters (32 blocks × 2816 wide, byte vocabulary), bf16 with Adam: 16 bytes per parameter, 48.8 GB — on
# one process. The model is built partitioned (ZeRO-3's zero.Init: no whole copy ever exists), its 16-bit parameters
# and its fp32 master + Adam state live in swap files under NVME_DIR; RAM holds the fp32 gradient partition, the
# blocks being computed and the swap buffers. The learning rate warms up linearly over WARMUP steps to LR (at batch
# 1 this width diverges without it). Prints per step the time split into compute and I/O wait, the bytes moved and
# the loss, then peak RSS and the bytes on disk.
# Then the baseline: the largest model of the same width that a plain PyTorch loop (bench/python_loop on the same
# LibTorch, fp32 + AdamW one tensor at a time: 16 bytes per parameter, the leanest plain loop) trains here without
# offload. Its depth is estimated from MemAvailable and then proven by two training steps, one block fewer each time
# the kernel refuses the memory; the demo's model is printed as a multiple of it. PLAIN=0 skips it.
#
#   [LR=3e-5] [WARMUP=10] [PLAIN=1] bench/scale_demo/run.sh [BUILD_DIR] [NVME_DIR] [STEPS] [N_LAYER] [N_EMBD]
set -euo pipefail
build=${1:-build}
nvme=${2:-/tmp/dscpp_scale}
steps=${3:-25}
n_layer=${4:-32}
n_embd=${5:-2816}
n_head=$((n_embd / 128))
lr=${LR:-3e-5}
warmup=${WARMUP:-10}
mkdir -p "$nvme"
config="$nvme/scale_config.json"
cat > "$config" <<JSON
{"train_batch_size": 1, "steps_per_print": 1, "bf16": {"enabled": true}, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": $lr, "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": $lr,
   "warmup_num_steps": $warmup, "warmup_type": "linear"}},
 "zero_optimization": {"stage": 3, "sub_group_size": 50000000, "overlap_comm": true,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$nvme", "buffer_count": 4},
   "offload_param": {"device": "nvme", "nvme_path": "$nvme", "buffer_count": 5}},
 "aio": {"block_size": 1048576, "queue_depth": 8}}
JSON
# Parameters: V·C + P·C + L·(12C² + 13C) + 2C, the model's closed form (V = 256 bytes, P = 1024 positions).
count() { echo $(( 256 * $2 + 1024 * $2 + $1 * (12 * $2 * $2 + 13 * $2) + 2 * $2 )); }
params=$(count "$n_layer" "$n_embd")
echo "scale_demo: $params parameters, swap files under $nvme ($(df -h --output=avail "$nvme" | tail -1 | tr -d ' ') free)," \
  "lr $lr after $warmup warmup steps, $steps steps"
rm -f "$nvme/metrics.jsonl"
OMP_NUM_THREADS=2 "$build/gpt-train" --no_progress --model gpt2-xl --n_layer "$n_layer" --n_embd "$n_embd" \
  --n_head "$n_head" --seq_len 32 --steps "$steps" --deepspeed_config "$config" --metrics "$nvme/metrics.jsonl"
"$build/bench/bench_scale_summary" "$nvme/metrics.jsonl" "$params"

[ "${PLAIN:-1}" = 1 ] || exit 0
# The plain loop's depth: 16 bytes per parameter within MemAvailable, less 1 GB for the interpreter, LibTorch and
# the activations; then down one block at a time until two steps train.
avail=$(awk '/MemAvailable/ { print $2 * 1024 }' /proc/meminfo)
per_layer=$(( 12 * n_embd * n_embd + 13 * n_embd ))
plain_layers=$(( (avail - (1 << 30)) / 16 / per_layer ))
while [ "$plain_layers" -gt 0 ]; do
  plain=$(count "$plain_layers" "$n_embd")
  echo "plain PyTorch loop: $plain_layers x $n_embd ($plain parameters, $(( 16 * plain / 1000000 )) MB of fp32" \
    "model states; MemAvailable $(( avail / 1000000 )) MB): 2 steps"
  if OMP_NUM_THREADS=2 /usr/bin/python3 "$(dirname "$0")/../python_loop/gpt_loop.py" --model gpt2-xl --no_foreach \
       --n_layer "$plain_layers" --n_embd "$n_embd" --n_head "$n_head" --seq_len 32 --micro_batch 1 --steps 2 \
       --lr "$lr" --metrics "$nvme/plain.jsonl" >"$nvme/plain.log" 2>&1; then
    awk -v p="$plain" -v big="$params" '{ line = $0 } END {
      sub(/.*"peak_rss_bytes":/, "", line); sub(/[,}].*/, "", line)
      printf "largest plain PyTorch model here: %.3f B parameters (peak RSS %.2f GB); the offloaded model is %.2fx it\n",
        p / 1e9, line / 1e9, big / p }' "$nvme/plain.jsonl"
    exit 0
  fi
  echo "  did not train ($(tail -1 "$nvme/plain.log" | cut -c1-120)); one block fewer"
  plain_layers=$((plain_layers - 1))
done
echo "no plain model of width $n_embd trains here"
