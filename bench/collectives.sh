#!/bin/sh
# bench/collectives.sh BUILD_DIR [ROUNDS] [CALLS]: loom's reduce_scatter_into and
# all_gather_into against a same-size all_reduce, Gloo on loopback, 4 and 2
# ranks, float32, 1 to 64 MiB ("size" is the all_reduce's buffer:
# reduce_scatter_into reduces it into 1/N-th, all_gather_into fills it from
# 1/N-th), each on loom's point-to-point exchange (what strategies use) and
# on the fallbacks (Gloo's alltoall, its list all_gather): loom-bench's
# collective microbenchmarks (docs/benchmarks.md),
#   loom-bench --fit-network FILE --world-sizes N --emulation point_to_point|alltoall
#              --fit-sizes 1048576,4194304,16777216,67108864 --fit-rounds ROUNDS --fit-calls CALLS
# (ROUNDS interleaved rounds, default 3, of CALLS calls back to back after a
# barrier, default 5; the median over the rounds of the mean per call). The
# last line is the 2-rank figure at 16 MiB:
#   reduce_scatter_vs_allreduce=R all_gather_vs_allreduce=G
set -eu
build=$(realpath "${1:-build}")
rounds=${2:-3}
calls=${3:-5}
meson compile -C "$build" tools/loom-bench tools/loom-run >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
for ranks in 4 2; do
  for how in point_to_point alltoall; do
    "$build/tools/loom-bench" --fit-network "$work/$ranks-$how.json" --world-sizes "$ranks" --emulation "$how" \
      --fit-sizes 1048576,4194304,16777216,67108864 --fit-rounds "$rounds" --fit-calls "$calls" > /dev/null
  done
done
/usr/bin/python3 - "$work" "$rounds" "$calls" <<'PY'
import json, sys
work, rounds, calls = sys.argv[1:]
def medians(ranks, how):
    net = json.load(open(f"{work}/{ranks}-{how}.json"))
    return {(s["collective"], round(s["payload_bytes"] / 2**20)): s["seconds"] * 1e3 for s in net["samples"]}
for ranks in (4, 2):
    p2p, fallback = medians(ranks, "point_to_point"), medians(ranks, "alltoall")
    print(f"{ranks} ranks, Gloo on loopback, float32; median ms per call over {rounds} interleaved rounds of "
          f"{calls} calls, and the ratio to a same-size all_reduce")
    print(f"{'size':<7} {'operation':<33} {'median_ms':>10} {'ratio':>8}")
    ratio_16 = {}
    for mib in (1, 4, 16, 64):
        rows = [("all_reduce", p2p, "all_reduce"), ("reduce_scatter_into", p2p, "reduce_scatter"),
                ("all_gather_into", p2p, "all_gather"), ("reduce_scatter_into/alltoall", fallback, "reduce_scatter"),
                ("all_gather_into/list_all_gather", fallback, "all_gather")]
        for name, table, kind in rows:
            value, reference = table[(kind, mib)], table[("all_reduce", mib)]
            print(f"{str(mib) + 'MiB':<7} {name:<33} {value:10.3f} {value / reference:8.3f}")
            if mib == 16:
                ratio_16[name] = value / reference
    print()
print(f"reduce_scatter_vs_allreduce={ratio_16['reduce_scatter_into']:.3f} "
      f"all_gather_vs_allreduce={ratio_16['all_gather_into']:.3f}")
PY
