#!/usr/bin/env bash
# ZeRO-Infinity scale demonstration (issue 6): trains a GPT whose model states do not fit in this machine's RAM —
# 3.05B parameters (32 blocks × 2816 wide, byte vocabulary), bf16 with Adam: 16 bytes per parameter, 48.8 GB — for a
# few steps on one process. The model is built partitioned (ZeRO-3's zero.Init: no whole copy ever exists), its
# 16-bit parameters and its fp32 master + Adam state live in swap files under NVME_DIR; RAM holds the fp32 gradient
# partition, the blocks being computed and the swap buffers. Prints per step the time split into compute and I/O
# wait, the bytes moved, then peak RSS and the bytes on disk.
#
#   bench/scale_demo/run.sh [BUILD_DIR] [NVME_DIR] [STEPS] [N_LAYER] [N_EMBD]
set -euo pipefail
build=${1:-build}
nvme=${2:-/tmp/dscpp_scale}
steps=${3:-3}
n_layer=${4:-32}
n_embd=${5:-2816}
n_head=$((n_embd / 128))
mkdir -p "$nvme"
config="$nvme/scale_config.json"
cat > "$config" <<JSON
{"train_batch_size": 1, "steps_per_print": 1, "bf16": {"enabled": true}, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}},
 "zero_optimization": {"stage": 3, "sub_group_size": 50000000, "overlap_comm": true,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$nvme", "buffer_count": 4},
   "offload_param": {"device": "nvme", "nvme_path": "$nvme", "buffer_count": 5}},
 "aio": {"block_size": 1048576, "queue_depth": 8}}
JSON
# Parameters: V·C + P·C + L·(12C² + 13C) + 2C, the model's closed form (V = 256 bytes, P = 1024 positions).
params=$(( 256 * n_embd + 1024 * n_embd + n_layer * (12 * n_embd * n_embd + 13 * n_embd) + 2 * n_embd ))
echo "scale_demo: $params parameters, swap files under $nvme ($(df -h --output=avail "$nvme" | tail -1 | tr -d ' ') free)"
rm -f "$nvme/metrics.jsonl"
OMP_NUM_THREADS=2 "$build/gpt-train" --no_progress --model gpt2-xl --n_layer "$n_layer" --n_embd "$n_embd" \
  --n_head "$n_head" --seq_len 32 --steps "$steps" --deepspeed_config "$config" --metrics "$nvme/metrics.jsonl"
"$build/bench/bench_scale_summary" "$nvme/metrics.jsonl" "$params"
