#!/usr/bin/env bash
# bench/python_overhead: the Python front end's cost. examples/python/train_gpt.py (gpt-train's GPT in plain PyTorch,
# driven through `import dscpp as deepspeed`) on one process at ZeRO stages 0, 2 and 3 against the strongest plain
# loop a user could write for the same model, data and AdamW (bench/python_loop/gpt_loop.py: torch.optim.AdamW with
# foreach=True), interleaved over ROUNDS rounds (bench/common.sh); then two processes, ZeRO-3 against ZeRO-2
# (dscpp launch, one core each). Targets: <= 1.03 (stages 0-2), <= 1.10 (stage 3) against the loop, <= 1.15 for
# ZeRO-3 / ZeRO-2 on two processes (DeepSpeed itself measured 1.08, 1.38 and 2.0 on this kind of machine).
# Expected time on a 2-core machine with the defaults: ~5 min.
# Usage: [MODEL=small] [ROUNDS=3] bench/python_overhead/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, MODEL, ROUNDS, OUT, interleave, ratio
for stage in 0 2 3; do zero_config "$stage" >"$OUT/stage$stage.json"; done
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"

example=("$PYTHON" "$ROOT/examples/python/train_gpt.py" --model "$MODEL" --seq_len 128)
loop=("$PYTHON" "$ROOT/bench/python_loop/gpt_loop.py" --model "$MODEL" --seq_len 128)
stage0=("${example[@]}" --deepspeed_config "$OUT/stage0.json")
stage2=("${example[@]}" --deepspeed_config "$OUT/stage2.json")
stage3=("${example[@]}" --deepspeed_config "$OUT/stage3.json")

echo "python_overhead: $MODEL, 1 process, micro-batch 8 x seq 128, $STEPS steps, $ROUNDS rounds"
interleave loop stage0 stage2 stage3
ratio stage0 loop "(target <= 1.03)"
ratio stage2 loop "(target <= 1.03)"
ratio stage3 loop "(target <= 1.10)"

launch=(env OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 2 --master_port)
two_stage2=("${launch[@]}" 29671 "$ROOT/examples/python/train_gpt.py" --model "$MODEL" --seq_len 128
            --deepspeed_config "$OUT/stage2.json")
two_stage3=("${launch[@]}" 29672 "$ROOT/examples/python/train_gpt.py" --model "$MODEL" --seq_len 128
            --deepspeed_config "$OUT/stage3.json")
echo "python_overhead: $MODEL, 2 processes (one core each), micro-batch 8 x seq 128 each"
interleave two_stage2 two_stage3
ratio two_stage3 two_stage2 "(target <= 1.15)"
