#!/usr/bin/env bash
# bench/moe: Mixture of Experts with expert parallelism against the dense model of equal active FLOPs per token, on 2
# processes (one core each), ZeRO stage 1, interleaved over ROUNDS rounds (bench/common.sh):
#   moe    gpt-train's small GPT (6 blocks) with 8 experts, top-2, in blocks 1, 3, 5, spread over the two ranks
#          (--ep_size 2, 4 experts each), capacity factor 1, no token left unrouted by RTS or sampling noise;
#   dense  the same GPT with 8 blocks: a top-2 MoE block computes its attention and two MLPs, so three of them cost
#          what four dense blocks do (the printed FLOPs per token, from gpt-train's metrics, say how close).
# Prints the tokens/s ratio moe / dense, the share of the MoE step spent in all-to-all (the layers' own clock:
# moe_all_to_all_s, forward and backward, rank 0), and each run's parameter bytes per rank (the experts counted where
# they live). What to expect: the MoE model holds ~3× the dense model's MLP parameters at about its cost per token,
# less the all-to-alls and the gate; a rank holds half of the experts.
# Expected time on a 2-core machine with the defaults: ~2 min.
# Usage: [ROUNDS=3] bench/moe/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, ROUNDS, OUT, interleave, ratio
MICRO_BATCH=8 zero_config 1 >"$OUT/ds.json"
launch=(env OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 2 --master_port)
common=(--model small --seq_len 128 --no_progress --deepspeed_config "$OUT/ds.json")
moe=("${launch[@]}" 29691 "$BUILD/gpt-train" "${common[@]}" --moe_experts 8 --moe_top_k 2 --ep_size 2
     --moe_use_rts false --moe_top2_2nd_expert_sampling false)
dense=("${launch[@]}" 29692 "$BUILD/gpt-train" "${common[@]}" --n_layer 8)

echo "moe: small GPT, 2 processes (one core each), micro-batch 8 x seq 128 per rank, $STEPS steps, $ROUNDS rounds"
FIELD=tokens_per_s interleave dense moe
FIELD=tokens_per_s ratio moe dense "(tokens/s, 8 experts top-2 ep 2 / dense 8 blocks)"
python3 - "$OUT/moe.$ROUNDS.jsonl" "$OUT/dense.$ROUNDS.jsonl" <<'PY'
import json, sys
moe, dense = ([json.loads(line) for line in open(path)] for path in sys.argv[1:3])
def per_token(rows):  # training FLOPs per token: every rank's model FLOP/s over the global tokens/s
    last = rows[-1]
    return last["model_flops_per_s"] * last["world_size"] / last["tokens_per_s"]
print(f"  active training FLOPs per token: moe {per_token(moe) / 1e6:.1f} M, dense {per_token(dense) / 1e6:.1f} M "
      f"(moe / dense {per_token(moe) / per_token(dense):.3f})")
timed = moe[3:]  # after the warm-up steps
a2a = (timed[-1]["moe_all_to_all_s"] - moe[2]["moe_all_to_all_s"]) / len(timed)
step = sum(r["step_ms"] for r in timed) / len(timed) / 1000
print(f"  all-to-all: {a2a * 1000:.1f} ms of a {step * 1000:.1f} ms step = {a2a / step:.3f} of the MoE step (rank 0)")
for name, rows in (("moe", moe), ("dense", dense)):
    m = rows[-1]["memory"]
    print(f"  {name}: rank 0 parameter bytes {m['params'] / 2**20:.2f} MiB, model states {m['model_states'] / 2**20:.1f} MiB")
PY
