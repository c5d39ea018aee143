#!/bin/sh
# bench/zero_offload.sh BUILD_DIR [NVME_DIR] [ROUNDS]
# ZeRO stage 3 with the optimizer state and the parameter partitions on NVMe
# (deepspeed_stage_3_offload_nvme; a directory on local disk, default a fresh
# one under /tmp), 2 ranks, MLP 784-1024-1024-1024-10, batch 64 per rank,
# Adam: one loom-bench cell (docs/benchmarks.md),
#   loom-bench --world-sizes 2 --batch 64 --steps 20 --warmup 5 --strategies
#     deepspeed_stage_3_offload_nvme+nvme_path=DIR+sub_group_size=145664+optimizer_buffer_count=4+block_size=1048576+queue_depth=8
# (sub_group_size a tenth of a rank's partition, so 12 sub-groups): the step
# time and each rank's NVMe stream read and write throughput over the
# measured steps (bytes / the time with at least one request of that kind in
# flight, timed by the stream's completion thread; loom/util/offload_io.hpp),
# beside the same disk's sequential direct-I/O throughput:
#   dd if=/dev/zero of=NVME/dd bs=1M count=256 oflag=direct conv=fsync
#   dd if=NVME/dd of=/dev/null bs=1M iflag=direct
# dd and loom alternate ROUNDS times (default 5); medians over the rounds.
# The last line is read_ratio=R write_ratio=W: the two ranks' throughputs
# summed (the disk serves both at once) over dd's (goal >= 0.70); rank 0
# alone is printed too.
set -eu
build=$(realpath "${1:-build}")
meson compile -C "$build" tools/loom-bench tools/loom-run >&2
rounds=${3:-5}
work=$(mktemp -d)
nvme=${2:-$work/nvme}
mkdir -p "$nvme"
trap 'rm -rf "$work" "$nvme/dd"' EXIT
export OMP_NUM_THREADS=1
cell="deepspeed_stage_3_offload_nvme+nvme_path=$nvme+sub_group_size=145664+optimizer_buffer_count=4"
cell="$cell+block_size=1048576+queue_depth=8"

mbps() {  # dd's summary line -> MB/s (10^6 bytes)
  awk '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/ && $(i+1) ~ /s,$/) t = $i; b = $1; printf "%.1f\n", b / t / 1e6 }'
}
for round in $(seq 1 "$rounds"); do
  dd if=/dev/zero of="$nvme/dd" bs=1M count=256 oflag=direct conv=fsync 2>&1 | mbps >> "$work/dd_write"
  dd if="$nvme/dd" of=/dev/null bs=1M iflag=direct 2>&1 | mbps >> "$work/dd_read"
  rm -f "$nvme/dd"
  "$build/tools/loom-bench" --world-sizes 2 --batch 64 --steps 20 --warmup 5 --strategies "$cell" \
    --out "$work/loom-$round" > "$work/loom-$round.log" 2>&1 || { cat "$work/loom-$round.log" >&2; exit 1; }
done
/usr/bin/python3 - "$(dirname "$(realpath "$0")")" "$work" "$rounds" "$cell" <<'PY'
import statistics, sys
sys.path.insert(0, sys.argv[1])
from loom_bench_cells import measured
work, rounds, cell = sys.argv[2], int(sys.argv[3]), sys.argv[4]
def dd(name):
    return statistics.median(float(line) for line in open(f"{work}/{name}"))
cells = [measured(f"{work}/loom-{r}/loom-bench.json", "zero_offload", [cell], 2)[cell] for r in range(1, rounds + 1)]
if any(not c.get("nvme") for c in cells):
    sys.exit("zero_offload: the cell moved no bytes to or from NVMe")
def median(key):
    return statistics.median(c["nvme"][key] for c in cells)
step = statistics.median(c["step_ms"]["median"] for c in cells)
read0, write0 = median("read_mb_per_s"), median("write_mb_per_s")
read_both, write_both = median("read_mb_per_s_all_ranks"), median("write_mb_per_s_all_ranks")
dd_read, dd_write = dd("dd_read"), dd("dd_write")
print(f"NVMe offload of optimizer state and parameters, stage 3, 2 ranks, 12 sub-groups per rank,")
print(f"{median('read_bytes_per_step') / 1e6:.2f} MB read and {median('written_bytes_per_step') / 1e6:.2f} MB written "
      f"per step per rank ({rounds} rounds, {sum(c['steps'] for c in cells)} steps):")
print(f"  step_ms median (rank 0) {step:.4f}")
print(f"  read:  rank 0 {read0:.1f} MB/s, both ranks (sum) {read_both:.1f} MB/s; dd {dd_read:.1f} MB/s (iflag=direct)")
print(f"  write: rank 0 {write0:.1f} MB/s, both ranks (sum) {write_both:.1f} MB/s; dd {dd_write:.1f} MB/s "
      f"(oflag=direct conv=fsync)")
print(f"rank 0 alone: read {read0 / dd_read:.4f}, write {write0 / dd_write:.4f} of dd")
print(f"read_ratio={read_both / dd_read:.4f} write_ratio={write_both / dd_write:.4f}")
PY
