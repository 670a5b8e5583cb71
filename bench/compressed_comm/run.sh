#!/usr/bin/env bash
# bench/compressed_comm: ZeRO++ against plain ZeRO-3 on gpt-train (bf16, micro-batch 8 x seq 128 per rank,
# OMP_NUM_THREADS=1), each pair in the same invocation, interleaved over ROUNDS rounds (bench/common.sh):
#   1. loopback, 2 processes: ZeRO-3 vs qwZ + qgZ; 4 processes: ZeRO-3 vs qwZ + hpZ 2 + qgZ. Prints the message
#      bytes rank 0's comms logger counted per op and step — the data-parallel group's, and hpZ's groups' as op[n] —
#      each op's ratio to ZeRO-3's and the data group's total, and the step-time ratio. Loopback has no bandwidth
#      limit, so here the quantization's own cost shows, not its saving.
#   2. a throttled link: two hosts made of network namespaces joined by a veth pair limited to RATE (default 1gbit,
#      tc's token bucket on both ends), 2 ranks on each, one `dscpp launch --no_ssh --node_rank K` per host, as two
#      machines of 2 GPUs joined by Ethernet: ZeRO-3 vs qwZ + hpZ 2 + qgZ (hpZ's groups are the hosts). Needs root and
#      `ip netns` (skipped with the reason otherwise). Prints the step-time ratio.
#   3. 1-bit Adam against Adam at stage 0 (bf16 gradients all-reduced), compressing from step 3 (freeze_step 2), on
#      loopback with 2 processes and over the throttled link with 2 x 2: the bytes per step and the step-time ratio.
# The compressed runs' losses are not compared here: tests/zero/zero_equivalence_test.cpp (ZeroPlusPlus.*) holds them
# to plain ZeRO-3's, tests/onebit/onebit_test.cpp 1-bit Adam's to Adam's.
# Expected time on a 2-core machine with the defaults: ~8 min.
# Usage: [MODEL=small] [ROUNDS=3] [RATE=1gbit] [LINK_ONLY=1] bench/compressed_comm/run.sh [build-dir] [steps]
#   LINK_ONLY=1 runs part 2 alone (another RATE, say).
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, MODEL, ROUNDS, OUT, interleave, ratio
RATE=${RATE:-1gbit}
DSCPP=$(realpath "$BUILD/dscpp")
GPT_TRAIN=$(realpath "$BUILD/gpt-train")

config() {  # ZERO_EXTRA: on stdout, bf16 and the comms logger on
  echo "{\"train_micro_batch_size_per_gpu\": 8, \"gradient_accumulation_steps\": 1, \"steps_per_print\": 1000,
 \"bf16\": {\"enabled\": true}, \"comms_logger\": {\"enabled\": true},
 \"zero_optimization\": {\"stage\": 3, \"overlap_comm\": true, \"reduce_bucket_size\": 5e5 $1},
 \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.1}}}"
}
config "" >"$OUT/zero3.json"
config ', "zero_quantized_weights": true, "zero_quantized_gradients": true' >"$OUT/qwz_qgz.json"
config ', "zero_quantized_weights": true, "zero_hpz_partition_size": 2, "zero_quantized_gradients": true' \
  >"$OUT/zeropp.json"

onebit_config() {  # OPTIMIZER EXTRA_PARAMS: stage 0, bf16, the comms logger on
  echo "{\"train_micro_batch_size_per_gpu\": 8, \"gradient_accumulation_steps\": 1, \"steps_per_print\": 1000,
 \"bf16\": {\"enabled\": true}, \"comms_logger\": {\"enabled\": true},
 \"zero_optimization\": {\"stage\": 0, \"reduce_bucket_size\": 5e5},
 \"optimizer\": {\"type\": \"$1\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.1 $2}}}"
}
onebit_config Adam "" >"$OUT/adam0.json"
onebit_config OneBitAdam ', "freeze_step": 2' >"$OUT/onebit.json"

gpt_train=("$GPT_TRAIN" --no_progress --peak_tflops 1 --model "$MODEL" --seq_len 128)
launch() {  # PROCESSES PORT
  echo env OMP_NUM_THREADS=1 "$DSCPP" launch --num_gpus "$1" --master_port "$2"
}
read -ra l2a <<<"$(launch 2 29661)"
read -ra l2b <<<"$(launch 2 29662)"
read -ra l4a <<<"$(launch 4 29663)"
read -ra l4b <<<"$(launch 4 29664)"
zero3_2=("${l2a[@]}" "${gpt_train[@]}" --deepspeed_config "$OUT/zero3.json")
zeropp_2=("${l2b[@]}" "${gpt_train[@]}" --deepspeed_config "$OUT/qwz_qgz.json")
zero3_4=("${l4a[@]}" "${gpt_train[@]}" --deepspeed_config "$OUT/zero3.json")
zeropp_4=("${l4b[@]}" "${gpt_train[@]}" --deepspeed_config "$OUT/zeropp.json")
adam_2=("${l2a[@]}" "${gpt_train[@]}" --deepspeed_config "$OUT/adam0.json")
onebit_2=("${l2b[@]}" "${gpt_train[@]}" --deepspeed_config "$OUT/onebit.json")

# Bytes rank 0's comms logger counted per op in one run's log (message size x count, summed over sizes), per step.
bytes_per_step() {  # LOG
  awk -v steps="$STEPS" '/\[comms\] summary, rank 0/ { on = 1; next }
    on && NF >= 4 && $3 ~ /^(B|KB|MB|GB)$/ {
      m = ($3 == "KB") ? 1024 : ($3 == "MB") ? 1048576 : ($3 == "GB") ? 1073741824 : 1
      b[$1] += $2 * m * $4 }
    END { for (op in b) printf "%s %.0f\n", op, b[op] / steps }' "$1" | sort
}
compare_bytes() {  # PLAIN ZEROPP (interleave names): round 1's logs
  echo "  message bytes per step (rank 0's comms logger; op[n]: on a sub-group of n ranks, hpZ's), $1 -> $2:"
  join -a 1 -a 2 -e 0 -o 0,1.2,2.2 <(bytes_per_step "$OUT/$1.1.jsonl.log") <(bytes_per_step "$OUT/$2.1.jsonl.log") |
    awk '{ printf "    %-18s %12.0f -> %12.0f  %s\n", $1, $2, $3, ($2 > 0) ? sprintf("(%.3f)", $3 / $2) : "(new)"
           if ($1 !~ /\[/) { p += $2; q += $3 } }
         END { printf "    %-18s %12.0f -> %12.0f  (%.3f)\n", "all, data group", p, q, q / p }'
}

echo "compressed_comm: gpt-train $MODEL, bf16, micro-batch 8 x seq 128 per rank, OMP_NUM_THREADS=1, $STEPS steps," \
  "$ROUNDS rounds"
if [ -z "${LINK_ONLY:-}" ]; then
  echo "loopback, 2 processes: ZeRO-3 vs qwZ + qgZ"
  interleave zero3_2 zeropp_2
  compare_bytes zero3_2 zeropp_2
  ratio zeropp_2 zero3_2 "(step time; loopback: no bandwidth to save)"
  echo "loopback, 4 processes: ZeRO-3 vs qwZ + hpZ 2 + qgZ"
  interleave zero3_4 zeropp_4
  compare_bytes zero3_4 zeropp_4
  ratio zeropp_4 zero3_4 "(step time; loopback: no bandwidth to save)"
  echo "loopback, 2 processes: Adam vs 1-bit Adam at stage 0 (compressing from step 3 of $STEPS)"
  interleave adam_2 onebit_2
  compare_bytes adam_2 onebit_2
  ratio onebit_2 adam_2 "(step time; loopback: no bandwidth to save)"
fi

# 2. Two hosts joined by a throttled link.
if [ "$(id -u)" != 0 ] || ! ip netns add dscppbenchprobe 2>/dev/null; then
  echo "throttled link: skipped (needs root and ip netns)"
  exit 0
fi
ip netns del dscppbenchprobe
ns=(dscppbench$$a dscppbench$$b)
link=(dscb$$a dscb$$b)
addr=(10.232.0.1 10.232.0.2)
cleanup_hosts() {
  for n in "${ns[@]}"; do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$n" 2>/dev/null || true
  done
  rm -rf "$OUT"
}
trap cleanup_hosts EXIT
ip netns add "${ns[0]}"
ip netns add "${ns[1]}"
ip link add "${link[0]}" netns "${ns[0]}" type veth peer name "${link[1]}" netns "${ns[1]}"
for h in 0 1; do
  ip netns exec "${ns[$h]}" ip link set lo up
  ip netns exec "${ns[$h]}" ip addr add "${addr[$h]}/24" dev "${link[$h]}"
  ip netns exec "${ns[$h]}" ip link set "${link[$h]}" up
  # What leaves each host goes at RATE at most: the link between the two "machines".
  ip netns exec "${ns[$h]}" tc qdisc add dev "${link[$h]}" root tbf rate "$RATE" burst 256kb latency 100ms
done
printf 'node0 slots=2\nnode1 slots=2\n' >"$OUT/hostfile"
# One launcher per host, in the background, as a user starts a two-node job with --no_ssh; the arguments interleave
# appends (--steps, --metrics) go to both, and rank 0 (on host 0) writes the metrics.
cat >"$OUT/two_hosts.sh" <<EOF
#!/usr/bin/env bash
config=\$1; port=\$2; shift 2
for h in 0 1; do
  ns=(${ns[*]})
  ip netns exec "\${ns[\$h]}" env -u GLOO_SOCKET_IFNAME OMP_NUM_THREADS=1 "$DSCPP" launch --hostfile "$OUT/hostfile" \\
    --no_ssh --node_rank \$h --master_addr ${addr[0]} --master_port \$port \\
    "$GPT_TRAIN" --no_progress --peak_tflops 1 --model "$MODEL" --seq_len 128 --deepspeed_config "\$config" "\$@" &
  pids[\$h]=\$!
done
wait \${pids[0]}; a=\$?; wait \${pids[1]}; b=\$?
exit \$((a + b))
EOF
chmod +x "$OUT/two_hosts.sh"
zero3_link=("$OUT/two_hosts.sh" "$OUT/zero3.json" 29665)
zeropp_link=("$OUT/two_hosts.sh" "$OUT/zeropp.json" 29666)
echo "two hosts x 2 processes joined by a $RATE link: ZeRO-3 vs qwZ + hpZ 2 + qgZ"
interleave zero3_link zeropp_link
compare_bytes zero3_link zeropp_link
ratio zeropp_link zero3_link "(step time over a $RATE link)"
adam_link=("$OUT/two_hosts.sh" "$OUT/adam0.json" 29667)
onebit_link=("$OUT/two_hosts.sh" "$OUT/onebit.json" 29668)
echo "two hosts x 2 processes joined by a $RATE link: Adam vs 1-bit Adam at stage 0 (compressing from step 3)"
interleave adam_link onebit_link
compare_bytes adam_link onebit_link
ratio onebit_link adam_link "(step time over a $RATE link)"
