# Sourced by the gpt-train benchmarks (scaling, zero3_overhead, host_malloc, …) with their arguments ([build-dir]
# [steps]): sets BUILD, STEPS (default DEFAULT_STEPS, else 10: 7 measured after the warm-up), MODEL (env, default
# small), ROUNDS (env, default 3: enough for min / median / max, and every default run within its few minutes) and
# OUT, a scratch directory removed on exit. Defines:
#   zero_config STAGE [EXTRA]  the config they share (micro-batch MICRO_BATCH, default 8, AdamW, buckets of 5e5) with
#                              zero_optimization's stage and EXTRA keys (', "key": value' …), on stdout
#   median FILE FIELD          the median of FIELD over a --metrics file's steps after the first 3 (warm-up, and the
#                              step in which ZeRO-3 records its gather order)
#   median_of                  the median of the numbers on stdin, one a line (the lower middle one of an even count)
#   interleave NAME...         runs the configurations to compare in turn, A B C A B C …, for ROUNDS rounds, so that
#                              a machine shared with other work slows them alike and its noise shows in the rounds.
#                              NAME's command line is the bash array NAME (without --steps and --metrics: the helper
#                              appends `--steps STEPS --metrics $OUT/NAME.ROUND.jsonl`). First one `--steps 1` run
#                              of each (round 0): it warms the page cache and measures the start-up. Per run it
#                              records the median FIELD (env, default step_ms) and, from GNU time over the whole
#                              process tree (every rank), minor page faults and system CPU time per step less the
#                              start-up's: (run − round 0) / (STEPS − 1). Prints each round's values, then per
#                              configuration the median over rounds of the three.
#   ratio NUM DEN [NOTE]       after interleave: each round's FIELD of NUM / FIELD of DEN, then min / median / max
#                              over rounds, and NOTE (a target)
zero_config() {
  echo "{\"train_micro_batch_size_per_gpu\": ${MICRO_BATCH:-8}, \"gradient_accumulation_steps\": 1,
 \"steps_per_print\": 1000,
 \"zero_optimization\": {\"stage\": $1, \"overlap_comm\": true, \"reduce_bucket_size\": 5e5 ${2:-}},
 \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.1}}}"
}

median() {
  tail -n +4 "$1" | sed -E "s/.*\"$2\":([0-9.e+-]+).*/\1/" | median_of
}

median_of() {
  sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

# One run of configuration $1 with $2 steps, its metrics in $3: GNU time's "minor-faults system-seconds" in $3.time.
# On failure prints the run's stderr and exits.
run_timed() {
  local -n cmd=$1
  /usr/bin/time -f '%R %S' -o "$3.time" "${cmd[@]}" --steps "$2" --metrics "$3" >"$3.log" 2>&1 \
    || { echo "$1 failed:"; cat "$3.log"; exit 1; }
}

interleave() {
  [ -x /usr/bin/time ] || { echo "interleave needs GNU time: apt-get install time"; exit 1; }
  [ "$STEPS" -ge 4 ] || { echo "steps must be >= 4: the first 3 are warm-up"; exit 1; }
  local name round value faults sys faults0 sys0
  for name in "$@"; do run_timed "$name" 1 "$OUT/$name.0.jsonl"; done
  : >"$OUT/results"
  for round in $(seq "$ROUNDS"); do
    local line="  round $round:"
    for name in "$@"; do
      local run="$OUT/$name.$round.jsonl"
      run_timed "$name" "$STEPS" "$run"
      # results: NAME ROUND FIELD faults/step sys-ms/step
      read -r faults sys <"$run.time"
      read -r faults0 sys0 <"$OUT/$name.0.jsonl.time"
      value=$(median "$run" "$FIELD")
      awk -v n="$name" -v r="$round" -v v="$value" -v f=$((faults - faults0)) -v s="$sys" -v s0="$sys0" \
        -v steps="$STEPS" 'BEGIN { print n, r, v, f / (steps - 1), 1000 * (s - s0) / (steps - 1) }' >>"$OUT/results"
      line+=$(printf '  %s %.1f' "$name" "$value")
    done
    echo "$line  ($FIELD)"
  done
  echo "  median of rounds; per step after start-up, summed over processes: minor page faults, system time" \
    "(and the 1-step run's):"
  for name in "$@"; do
    read -r faults0 sys0 <"$OUT/$name.0.jsonl.time"
    awk -v n="$name" -v field="$FIELD" -v f0="$faults0" -v s0="$sys0" \
      -v v="$(awk -v n="$name" '$1 == n { print $3 }' "$OUT/results" | median_of)" \
      -v f="$(awk -v n="$name" '$1 == n { print $4 }' "$OUT/results" | median_of)" \
      -v s="$(awk -v n="$name" '$1 == n { print $5 }' "$OUT/results" | median_of)" \
      'BEGIN { printf "    %-20s %8.1f %s %8.0f faults/step %6.1f sys ms/step  (%.0f, %.2f s)\n",
                      n, v, field, f, s, f0, s0 }'
  done
}

ratio() {
  awk -v a="$1" -v b="$2" -v note="${3:-}" '
    $1 == a { num[$2] = $3 }  $1 == b { den[$2] = $3 }
    END {
      for (r = 1; r in num; ++r) { x[r] = num[r] / den[r]; rounds = rounds sprintf(" %.3f", x[r]) }
      n = r - 1
      for (i = 2; i <= n; ++i) for (j = i; j > 1 && x[j] < x[j - 1]; --j) { t = x[j]; x[j] = x[j - 1]; x[j - 1] = t }
      printf "  %s / %s:%s -> min / median / max %.3f / %.3f / %.3f %s\n", a, b, rounds, x[1], x[int((n + 1) / 2)],
        x[n], note
    }' "$OUT/results"
}

BUILD=${1:-build}
# The interpreter the build is for (its torch is the one gpt-train links): the plain PyTorch baselines run under it.
PYTHON=${PYTHON:-$(sed -n 's/^DSCPP_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)}
STEPS=${2:-${DEFAULT_STEPS:-10}}
MODEL=${MODEL:-small}
ROUNDS=${ROUNDS:-3}
FIELD=${FIELD:-step_ms}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
