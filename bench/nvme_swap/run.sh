#!/usr/bin/env bash
# bench/nvme_swap: the disk's best rates from fio (Debian's fio: O_DIRECT, io_uring, the store's block size and queue
# depth, 1, 2 and 4 jobs; the best of them), then bench_nvme_swap on the same directory with those rates as its
# baseline: the NVMe optimizer store's write, read and read+write sweep as a share of fio's, and the share of the
# sweep's I/O a compute loop hides.
# Expected time on a 2-core machine with the defaults: ~2 min (9 fio runs of 2 GiB, then the store).
# Usage: [DIR=/tmp] [GIB=2] [BLOCK=1048576] [DEPTH=8] bench/nvme_swap/run.sh [build-dir]
set -euo pipefail
BUILD=${1:-build}
DIR=${DIR:-${TMPDIR:-/tmp}}
GIB=${GIB:-2}
BLOCK=${BLOCK:-1048576}
DEPTH=${DEPTH:-8}
command -v fio >/dev/null || { echo "bench/nvme_swap needs fio: apt-get install fio"; exit 1; }
WORK=$(mktemp -d "$DIR/nvme_swap.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# fio_rate RW JOBS: GB/s (read + write summed) of one fio run over GIB in all, split across JOBS files.
fio_rate() {
  local size_mb=$((GIB * 1024 / $2))
  fio --name=disk --directory="$WORK" --size="${size_mb}m" --bs="$BLOCK" --iodepth="$DEPTH" --direct=1 \
    --ioengine=io_uring --rw="$1" --rwmixread=50 --numjobs="$2" --group_reporting --output-format=json 2>/dev/null \
    | python3 -c 'import json, sys; j = json.load(sys.stdin)["jobs"][0]
print("%.3f" % ((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e9))'
  rm -f "$WORK"/disk.*
}
best() { sort -g | tail -1; }

echo "fio: O_DIRECT, io_uring, block $BLOCK B, depth $DEPTH, $GIB GiB per run in $DIR"
declare -A rate
for rw in write read rw; do
  runs=""
  for jobs in 1 2 4; do runs+="$(fio_rate "$rw" "$jobs") "; done
  rate[$rw]=$(echo "$runs" | tr ' ' '\n' | grep . | best)
  echo "  $rw: $runs GB/s with 1, 2, 4 jobs -> best ${rate[$rw]}"
done
"$BUILD/bench/bench_nvme_swap" --dir "$WORK" --gib "$GIB" --block_size "$BLOCK" --queue_depth "$DEPTH" \
  --fio_write "${rate[write]}" --fio_read "${rate[read]}" --fio_mixed "${rate[rw]}"
