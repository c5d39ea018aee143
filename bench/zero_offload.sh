#!/bin/sh
# bench/zero_offload.sh BUILD_DIR [NVME_DIR] [ROUNDS]
# ZeRO stage 3 with the optimizer state and the parameter partitions on NVMe
# (deepspeed_stage_3_offload_nvme; a directory on local disk, default a fresh
# one under /tmp), 2 ranks, MLP 784-1024-1024-1024-10, batch 64 per rank,
# Adam (build/bench/zero_offload_bench): per-step time and the NVMe
# stream's read and write throughput of each rank (bytes / time
# with at least one request in flight, timed by a completion thread), beside the same disk's sequential direct-I/O throughput:
#   dd if=/dev/zero of=NVME/dd bs=1M count=256 oflag=direct conv=fsync
#   dd if=NVME/dd of=/dev/null bs=1M iflag=direct
# dd and loom alternate ROUNDS times (default 5); medians. The last line is
# read_ratio=R write_ratio=W: the two ranks' throughputs summed (the disk
# serves both at once) over dd's (goal >= 0.70); rank 0 alone is printed too.
set -eu
build=$(realpath "${1:-build}")
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"
build_bench "$build" zero_offload_bench
rounds=${3:-5}
work=$(mktemp -d)
nvme=${2:-$work/nvme}
mkdir -p "$nvme"
trap 'rm -rf "$work" "$nvme/dd"' EXIT
export OMP_NUM_THREADS=1

mbps() {  # dd's summary line -> MB/s (10^6 bytes)
  awk '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/ && $(i+1) ~ /s,$/) t = $i; b = $1; printf "%.1f\n", b / t / 1e6 }'
}
for _ in $(seq 1 "$rounds"); do
  dd if=/dev/zero of="$nvme/dd" bs=1M count=256 oflag=direct conv=fsync 2>&1 | mbps >> "$work/dd_write"
  dd if="$nvme/dd" of=/dev/null bs=1M iflag=direct 2>&1 | mbps >> "$work/dd_read"
  rm -f "$nvme/dd"
  "$build/tools/loom-run" --accelerator cpu --strategy deepspeed_stage_3 --devices 2 \
    "$build/bench/zero_offload_bench" "$nvme" 20 >> "$work/loom" 2>/dev/null
done

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
field() { grep "^rank=$1 " "$work/loom" | grep -o " $2=[0-9.]*" | cut -d= -f2 | median; }
step=$(field 0 step_ms)
read0=$(field 0 read_MBps)
write0=$(field 0 write_MBps)
read_both=$(awk -v a="$read0" -v b="$(field 1 read_MBps)" 'BEGIN { printf "%.1f", a + b }')
write_both=$(awk -v a="$write0" -v b="$(field 1 write_MBps)" 'BEGIN { printf "%.1f", a + b }')
dd_read=$(median < "$work/dd_read")
dd_write=$(median < "$work/dd_write")
echo "NVMe offload of optimizer state and parameters, stage 3, 2 ranks, $(grep -o 'sub_groups=[0-9]*' "$work/loom" | head -n 1) per rank,"
echo "$(field 0 read_MB) MB read and $(field 0 written_MB) MB written per step per rank ($rounds rounds, $(grep -c '^rank=0 ' "$work/loom") steps):"
echo "  step_ms median (rank 0) $step"
echo "  read:  rank 0 $read0 MB/s, both ranks (sum) $read_both MB/s; dd $dd_read MB/s (iflag=direct)"
echo "  write: rank 0 $write0 MB/s, both ranks (sum) $write_both MB/s; dd $dd_write MB/s (oflag=direct conv=fsync)"
awk -v r="$read0" -v w="$write0" -v dr="$dd_read" -v dw="$dd_write" \
  'BEGIN { printf "rank 0 alone: read %.4f, write %.4f of dd\n", r / dr, w / dw }'
awk -v r="$read_both" -v w="$write_both" -v dr="$dd_read" -v dw="$dd_write" \
  'BEGIN { printf "read_ratio=%.4f write_ratio=%.4f\n", r / dr, w / dw }'
