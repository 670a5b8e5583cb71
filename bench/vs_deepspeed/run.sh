#!/usr/bin/env bash
# bench/vs_deepspeed: the headline comparison. The same user script (examples/python/train_gpt.py, written for
# `import dscpp as deepspeed`) trains the same GPT on the same data and config under real DeepSpeed (the release
# scripts/setup.sh pins, its default optimizer for "AdamW": FusedAdam, on its CPU accelerator over Gloo; started
# through on_deepspeed.py, which only points the name at DeepSpeed) and under our engine, beside the plain PyTorch
# loop (bench/python_loop/gpt_loop.py, AdamW foreach), interleaved over ROUNDS rounds (bench/common.sh): ZeRO 0 and 3
# on one process (every core), ZeRO 2 and 3 on two processes (one core each, both started by `dscpp launch`). Prints
# each one's median step time and the ratios ours / DeepSpeed (target <= 0.9 in every case) and ours / loop.
# Expected time on a 2-core machine with the defaults: ~8 min.
# Usage: [MODEL=small] [ROUNDS=3] [SEQ=64] bench/vs_deepspeed/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, MODEL, ROUNDS, OUT, interleave, ratio
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SEQ=${SEQ:-64}
SITE=$(sed -n 's/^DSCPP_PYTHON_SITE_DIR:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c "import deepspeed" 2>/dev/null ||
  { echo "vs_deepspeed: DeepSpeed is not installed for $PYTHON (scripts/setup.sh installs the pinned release)"; exit 2; }
for stage in 0 2 3; do zero_config "$stage" >"$OUT/stage$stage.json"; done

script="$ROOT/examples/python/train_gpt.py"
on_ds="$ROOT/bench/vs_deepspeed/on_deepspeed.py"
args=(--model "$MODEL" --seq_len "$SEQ")
one=(env OMP_NUM_THREADS="$(nproc)" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1)
ours_z0=("${one[@]}" MASTER_PORT=29681 "$PYTHON" "$script" "${args[@]}" --deepspeed_config "$OUT/stage0.json")
ds_z0=("${one[@]}" MASTER_PORT=29682 "$PYTHON" "$on_ds" "$script" "${args[@]}" --deepspeed_config "$OUT/stage0.json")
ours_z3=("${one[@]}" MASTER_PORT=29683 "$PYTHON" "$script" "${args[@]}" --deepspeed_config "$OUT/stage3.json")
ds_z3=("${one[@]}" MASTER_PORT=29684 "$PYTHON" "$on_ds" "$script" "${args[@]}" --deepspeed_config "$OUT/stage3.json")
loop=(env OMP_NUM_THREADS="$(nproc)" "$PYTHON" "$ROOT/bench/python_loop/gpt_loop.py" "${args[@]}")

echo "vs_deepspeed: $MODEL, seq $SEQ, micro-batch ${MICRO_BATCH:-8}, 1 process x $(nproc) threads, $STEPS steps," \
  "$ROUNDS rounds; DeepSpeed $("$PYTHON" -c 'import deepspeed; print(deepspeed.__version__)' 2>/dev/null | tail -1)"
interleave ours_z0 ds_z0 ours_z3 ds_z3 loop
ratio ours_z0 ds_z0 "(target <= 0.9)"
ratio ours_z3 ds_z3 "(target <= 0.9)"
ratio ours_z0 loop "(ZeRO-0 against the plain loop)"

launch=(env OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 2 --master_port)
two_ours_z2=("${launch[@]}" 29691 "$script" "${args[@]}" --deepspeed_config "$OUT/stage2.json")
two_ds_z2=("${launch[@]}" 29692 "$on_ds" "$script" "${args[@]}" --deepspeed_config "$OUT/stage2.json")
two_ours_z3=("${launch[@]}" 29693 "$script" "${args[@]}" --deepspeed_config "$OUT/stage3.json")
two_ds_z3=("${launch[@]}" 29694 "$on_ds" "$script" "${args[@]}" --deepspeed_config "$OUT/stage3.json")
echo "vs_deepspeed: 2 processes (one core each), micro-batch ${MICRO_BATCH:-8} x seq $SEQ each"
interleave two_ours_z2 two_ds_z2 two_ours_z3 two_ds_z3
ratio two_ours_z2 two_ds_z2 "(target <= 0.9)"
ratio two_ours_z3 two_ds_z3 "(target <= 0.9)"
