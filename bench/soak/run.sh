#!/usr/bin/env bash
# bench/soak: a long run that must not grow. gpt-train tiny, 2 ranks, ZeRO-3 with parameters offloaded to CPU memory
# and optimizer state swapped to NVMe files, a checkpoint every 100 steps, STEPS steps (default 2000; 2-3 minutes on
# a 2-core machine). Every step rank 0's metrics record its RSS, open file descriptors and the swap files' size;
# after a warm-up (the first WARMUP steps, default 200: caches, the first checkpoints) each may grow by < 1%.
# Prints, per quantity, the value at the end of the warm-up, the largest after it and the growth; exits 1 if any
# grew 1% or more. Expected time on a 2-core machine with the defaults: ~3 min.
# Usage: [WARMUP=200] [KEEP=FILE] bench/soak/run.sh [build-dir] [steps] (KEEP: copy rank 0's
# metrics there, to look at the curves).
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-2000}
WARMUP=${WARMUP:-200}
OUT=$(mktemp -d /tmp/dscpp_soak.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
mkdir -p "$OUT/nvme"
cat >"$OUT/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 100000,
 "gradient_clipping": 1.0,
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 20000, "sub_group_size": 100000,
   "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "nvme", "nvme_path": "$OUT/nvme"}},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}}}
JSON
echo "soak: gpt-train tiny, 2 ranks, ZeRO-3 (params on CPU, optimizer state on NVMe files), a checkpoint every 100" \
     "steps, $STEPS steps; growth after step $WARMUP must stay under 1%"
start=$(date +%s)
# A memory limit per rank, so a leak ends as an error rather than with the OOM killer (8 GiB of address space: the
# run needs well under 2 GiB resident).
OMP_NUM_THREADS=1 prlimit --as=$((8 << 30)) "$BUILD/dscpp" launch --num_gpus 2 --master_port 29661 \
  "$BUILD/gpt-train" --no_progress --peak_tflops 1 --model tiny --seq_len 64 --deepspeed_config "$OUT/ds.json" \
  --steps "$STEPS" --save_dir "$OUT/ckpt" --save_interval 100 --metrics "$OUT/metrics.jsonl" >"$OUT/log" 2>&1 ||
  { tail -20 "$OUT/log"; exit 1; }
echo "ran $STEPS steps in $(( $(date +%s) - start )) s"
[ -z "${KEEP:-}" ] || cp "$OUT/metrics.jsonl" "$KEEP"
python3 - "$OUT/metrics.jsonl" "$WARMUP" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
warmup = int(sys.argv[2])
base = next(r for r in rows if r["step"] == warmup)
after = [r for r in rows if r["step"] > warmup]
failed = False
for key, unit in (("rss_bytes", "bytes"), ("open_fds", "descriptors"), ("swap_file_bytes", "bytes")):
    start, peak = base[key], max(r[key] for r in after)
    growth = (peak - start) / start if start else 0.0
    failed |= growth >= 0.01
    print(f"{key:16s} at step {warmup}: {start:>12,} {unit:11s} largest after: {peak:>12,}  growth {100 * growth:+.3f}%"
          f"  {'ok' if growth < 0.01 else 'GREW'}")
sys.exit(1 if failed else 0)
PY
