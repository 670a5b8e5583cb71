# Sourced by the gpt-train benchmarks (scaling, zero3_overhead, host_malloc) with their arguments ([build-dir]
# [steps]): sets BUILD and STEPS, and OUT, a scratch directory removed on exit. Defines:
#   zero_config STAGE [EXTRA]  the config they share (micro-batch 8, AdamW, buckets of 5e5) with zero_optimization's
#                              stage and EXTRA keys (', "key": value' …), on stdout
#   median FILE FIELD          the median of FIELD over a --metrics file's steps after the first 3 (warm-up, and the
#                              step in which ZeRO-3 records its gather order)
zero_config() {
  echo "{\"train_micro_batch_size_per_gpu\": 8, \"gradient_accumulation_steps\": 1, \"steps_per_print\": 1000,
 \"zero_optimization\": {\"stage\": $1, \"overlap_comm\": true, \"reduce_bucket_size\": 5e5 ${2:-}},
 \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.1}}}"
}

median() {
  tail -n +4 "$1" | sed -E "s/.*\"$2\":([0-9.e+-]+).*/\1/" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

BUILD=${1:-build}
STEPS=${2:-20}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
