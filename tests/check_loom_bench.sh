#!/bin/sh
# check_loom_bench.sh LOOM_BENCH LOOM_RUN LOOM_PLOT: loom-bench's smoke test (a small
# MLP, few steps: it checks the output, not a speed).
# - The default matrix at 1 and 2 ranks: every cell of every world size is in
#   the table, the CSV and the JSON; every cell is measured (steps, a step
#   time with p10 <= median <= p90, parts that add up to it, samples/s,
#   FLOP/s and RSS), but single_device at 2 ranks, refused with its reason;
#   the ratio to single_device is 1 for single_device itself; the PyTorch
#   peers (torch_ddp, torch_zero1) are measured and ddp and ZeRO-1 have a
#   ratio to them; every loom cell's
#   collective payload per step equals its strategy's formula, byte for byte
#   (tools/bench/cell.hpp: 0 at one rank), and at 3 ranks, where units are
#   padded to a multiple of 3, for FSDP and ZeRO too; so does every cell's
#   model state per rank (a counting allocator), but ddp's, which has no
#   formula yet (its Reducer's buckets).
# - Communication: every loom cell with collectives at 2 ranks has a
#   communication time in flight, its step's collectives replayed alone and
#   the alpha-beta model's prediction (--network fit: fitted in the run);
#   its one-step trace carries the payload the counters saw; the wire bytes
#   are the algorithms' (all_reduce's ring: 2(N-1)/N, loom's pairwise
#   exchange: (N-1)/N); the validation ends with its summary line; the
#   projection on the stated cluster (2 us, 200 Gb/s) equals the model's
#   formula, recomputed here from the trace, and leaves model_parallel and
#   hybrid sharding (groups that are not the world) out.
# - --fit-network writes a network file --network reads back; a file that
#   is not one is refused before anything runs, saying what is expected;
#   --fit-kinds all_reduce --fit-raw-baseline measures loom's all_reduce and
#   c10d's (bench/allreduce.sh).
# - An NVMe offload cell reports its bytes per step and throughput, rank 0's
#   and summed over the ranks (bench/zero_offload.sh).
# - --optimizer sgd: the state formulas with no optimizer state hold.
# - The formulas hold at bf16-mixed and bf16-true (fsdp, ZeRO 1-3,
#   model_parallel), on 2-D meshes (HYBRID_SHARD 2 x 2, model_parallel
#   2 x 2) and for ddp at 4 ranks.
# - ddp at bf16-true on Gloo is refused saying what works; fsdp runs.
# - A model library (the char transformer's, examples/char_transformer_bench.cpp,
#   through loom/util/bench_model.hpp's entry point) trains under raw, ddp,
#   fsdp and model_parallel at 2 ranks, the header names it, raw, ddp and
#   fsdp carry and hold their formulas' bytes for its shape (its units, read
#   by loom::unit_parameters), model_parallel has none (its plan is the
#   library's); a library that is not one is refused with what is expected.
# - loom-plot --bench draws the matrix's CSV: an SVG with one bar row per
#   measured cell.
# - `loom-run --devices 2 bench` runs one world size the way loom-run starts
#   any program, and rank 0 alone prints the table.
# - Under mpirun one loom cell runs; two are refused with what to do.
# - --one-rank-overhead ends with worst_one_rank_ratio=R strategy=NAME.
# - A malformed cell is refused with what is accepted.
set -eu
bench=$(realpath "$1")
loom_run=$(realpath "$2")
loom_plot=$(realpath "$3")
cluster=$(realpath "$4")
model_library=${5:+$(realpath "$5")}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
small="--widths 16,32,32,32,4 --batch 8 --steps 10 --warmup 2 --block 5"

timeout 100 "$bench" $small --world-sizes 1,2 --replays 4 --network fit --project "$cluster" --out matrix \
  > matrix.txt 2> matrix.err ||
  { cat matrix.txt matrix.err; echo "FAIL: loom-bench (default matrix) failed"; exit 1; }
cat matrix.txt
/usr/bin/python3 - matrix.txt matrix/loom-bench.csv matrix/loom-bench.json <<'EOF'
import csv, json, sys
# An earlier cell's scalar (a loss: 4 bytes) may be freed while a cell is counted:
# a state may read up to 16 bytes low (seen once: 4 bytes).
scalars = 16
table, csv_path, json_path = sys.argv[1:]
text = open(table).read()
# The first table has one row per cell.
rows = [l for l in text[text.index("| cell |"):].split("\n\n")[0].splitlines()[2:] if l.startswith("| ")]
cells = json.load(open(json_path))["cells"]
lines = list(csv.DictReader(open(csv_path)))
problems = []
if not (len(rows) == len(cells) == len(lines)) or len(cells) < 20:
    problems.append(f"{len(rows)} table rows, {len(cells)} JSON cells, {len(lines)} CSV rows")
names = {1: set(), 2: set()}
for c in cells:
    names[c["world_size"]].add(c["cell"])
    if c["cell"] == "single_device" and c["world_size"] == 2:
        if "one process" not in c["refused"]:
            problems.append(f"single_device at 2 ranks: refused is {c['refused']!r}")
        continue
    where = f"{c['cell']} at {c['world_size']} rank(s)"
    if c["refused"]:
        problems.append(f"{where} was refused: {c['refused']}")
        continue
    step = c["step_ms"]
    if c["peer"]:  # PyTorch's own: timings only
        if c["steps"] != 10 or not 0 < step["p10"] <= step["median"] <= step["p90"]:
            problems.append(f"{where}: steps {c['steps']}, step_ms {step}")
        continue
    if c["cell"] in ("ddp", "deepspeed_stage_1") and not c["vs_peer"]:
        problems.append(f"{where}: no ratio to its PyTorch peer")
    parts = c["forward_ms"] + c["backward_ms"] + c["optimizer_ms"]
    # Medians of parts need not add up to the median of sums: within the spread.
    if c["steps"] != 10 or not 0 < step["p10"] <= step["median"] <= step["p90"] or \
            not 0.5 * step["p10"] <= parts <= 1.5 * step["p90"]:
        problems.append(f"{where}: steps {c['steps']}, step_ms {step}")
    if c["samples_per_second"] <= 0 or c["flop_per_second"] <= 0 or c["rss_peak_mib"] <= 0:
        problems.append(f"{where}: throughput or RSS missing: {c}")
    if c["payload_formula_bytes"] is None or c["payload_bytes_per_step"] != c["payload_formula_bytes"]:
        problems.append(f"{where}: payload {c['payload_bytes_per_step']} bytes per step, formula "
                        f"{c['payload_formula_bytes']} ({c['collectives_by_kind']})")
    # ddp: a formula at one rank (no Reducer) and from 3 ranks (formulas.hpp).
    no_formula = c["cell"].startswith("ddp") and (c["world_size"] == 2 or "find_unused_parameters_true" in c["cell"])
    # Tensor parallel's group may keep one pooled receive buffer of an
    # activation (batch 8 x width 32 floats) from the steps the count saw.
    slack = 8 * 32 * 4 if c["cell"] == "model_parallel" and c["world_size"] > 1 else 0
    if (c["state_formula_bytes"] is None) != no_formula or (not no_formula and not (
            c["state_formula_bytes"] - scalars <= c["state_bytes"] <= c["state_formula_bytes"] + slack)):
        problems.append(f"{where}: model state {c['state_bytes']} bytes, formula {c['state_formula_bytes']}")
    if c["world_size"] == 2 and c["cell"] not in ("raw", "parallel") and c["collectives_per_step"] < 1:
        problems.append(f"{where}: no collective recorded")
    # The trace of one step carries the payload the counters saw per step;
    # the wire estimate is each kind's algorithm at N ranks.
    traced = sum(p for _, p in c["step_collectives"])
    if traced != c["payload_bytes_per_step"] or len(c["step_collectives"]) != c["collectives_per_step"]:
        problems.append(f"{where}: one step's trace {c['step_collectives']} against "
                        f"{c['collectives_per_step']} collectives, {c['payload_bytes_per_step']} bytes per step")
    n = c["world_size"]
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "broadcast": (n - 1) / n}
    wire = sum(factor[k] * p for k, p in c["step_collectives"])
    if abs(wire - c["wire_bytes_per_step"]) > 1:
        problems.append(f"{where}: wire bytes {c['wire_bytes_per_step']}, the algorithms say {wire}")
    if n == 2 and c["collectives_per_step"] > 0 and c["cell"] != "parallel":
        if not (c["comm_in_flight_ms"] > 0 and (c["comm_alone_ms"] or 0) > 0 and (c["predicted_comm_ms"] or 0) > 0):
            problems.append(f"{where}: communication in flight {c['comm_in_flight_ms']}, alone "
                            f"{c['comm_alone_ms']}, model {c['predicted_comm_ms']}")
for c in cells:
    if c["cell"] == "single_device" and c["world_size"] == 1 and c["vs_single_device"] != 1.0:
        problems.append(f"single_device against itself: {c['vs_single_device']}")
for required in ("raw", "single_device", "ddp", "fsdp", "fsdp+sharding_strategy=SHARD_GRAD_OP",
                 "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3", "model_parallel",
                 "torch_ddp", "torch_zero1"):
    for n in (1, 2):
        if required not in names[n]:
            problems.append(f"no cell {required} at {n} rank(s)")
if names[1] != names[2]:
    problems.append(f"the world sizes ran different cells: {sorted(names[1] ^ names[2])}")
print("\n".join(problems) if problems else f"matrix: {len(cells)} cells in the table, the CSV and the JSON")
sys.exit(1 if problems else 0)
EOF

/usr/bin/python3 - matrix.txt matrix/loom-bench.json matrix/network-2.json <<'EOF'
import json, sys
text, cells, fitted = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))["cells"], json.load(open(sys.argv[3]))
problems = []
with_collectives = [c for c in cells if c["world_size"] == 2 and not c["refused"] and not c["peer"]
                    and c["collectives_per_step"] > 0]
summary = [l for l in text.splitlines() if l.startswith("alpha_beta_within_25pct=")]
if len(summary) != 1 or not summary[0].split()[0].endswith(f"/{len(with_collectives)}"):
    problems.append(f"validation summary {summary} for {len(with_collectives)} cells with collectives")
if set(fitted["collectives"]) != {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"} or \
        len(fitted["samples"]) != 4 * 13 + 1:
    problems.append(f"the fitted network: {sorted(fitted['collectives'])}, {len(fitted['samples'])} samples")
# The projection: 2 us per message step, 200 Gb/s; ring all_reduce: 2(N-1) steps, 2(N-1)/N of the
# payload sent; pairwise exchange: N-1 and (N-1)/N.
alpha, beta = 2e-6, 8e-9 / 200
def projected(c, n):
    algorithm = {"all_reduce": (2 * (n - 1), 2 * (n - 1) / n), "all_gather": (n - 1, (n - 1) / n),
                 "reduce_scatter": (n - 1, (n - 1) / n)}
    return sum(algorithm[k][0] * alpha + algorithm[k][1] * p * beta for k, p in c["step_collectives"]) * 1e3
block = text[text.index("PROJECTION, not a measurement"):]
rows = {l.split(" | ")[0][2:]: l for l in block.splitlines() if l.startswith("| ") and not l.startswith("| cell")}
for c in with_collectives:
    name = f"{c['cell']} ({c['precision']})"
    if c["cell"].startswith("model_parallel") or "HYBRID" in c["cell"]:
        if name in rows:
            problems.append(f"{name} (groups that are not the world) was projected")
        continue
    if name not in rows:
        problems.append(f"no projection of {name}")
        continue
    printed = [float(v) for v in rows[name].strip("| ").split(" | ")[1:]]
    expected = [projected(c, n) for n in (8, 16, 32, 64, 128, 256, 512, 1024)]
    if len(printed) != 8 or any(abs(p - e) > 0.0006 for p, e in zip(printed, expected)):
        problems.append(f"{name}: projected {printed}, the formula says {[round(e, 3) for e in expected]}")
print("\n".join(problems) if problems else
      f"communication: {len(with_collectives)} cells validated and projected; {summary[0]}")
sys.exit(1 if problems else 0)
EOF

timeout 60 "$loom_run" --devices 2 "$bench" --fit-network fitted.json > fit.txt 2>&1 ||
  { cat fit.txt; echo "FAIL: --fit-network failed"; exit 1; }
timeout 60 "$bench" $small --world-sizes 2 --strategies raw,fsdp --replays 2 --network fitted.json --out '' \
  > with-file.txt 2>&1 || { cat with-file.txt; echo "FAIL: --network FILE failed"; exit 1; }
grep -q '^alpha_beta_within_25pct=[0-9]/1 ' with-file.txt ||
  { cat with-file.txt; echo "FAIL: --network FILE: no validation of fsdp"; exit 1; }
echo '{"name": "bad", "other": {"alpha_us": -1, "bandwidth_gbit_s": 200}}' > bad-network.json
status=0
timeout 30 "$bench" --network bad-network.json --out '' > bad-network.txt 2>&1 || status=$?
if [ "$status" -eq 0 ] || ! grep -q "alpha_us and bandwidth_gbit_s must be finite numbers >= 0" bad-network.txt; then
  cat bad-network.txt
  echo "FAIL: a bad network file was not refused up front (exit $status)"
  exit 1
fi
# The formulas at other precisions (bf16-mixed: float32 parameters, 16-bit
# reduce-scatter, DeepSpeed's 16-bit mode; bf16-true) and on 2-D meshes
# (HYBRID_SHARD 2 x 2, model_parallel data 2 x tensor 2), and ddp's from 3
# ranks (4 here), byte for byte.
tiny="--widths 16,32,32,32,4 --batch 8 --steps 4 --warmup 1 --block 2 --replays 1"
# One precision per run, model_parallel last: a tensor-parallel cell's pooled
# activation buffer (1 KiB here) may be freed while the next cell is counted.
for precision in bf16-mixed bf16-true; do
  timeout 60 "$bench" $tiny --world-sizes 2 --precisions "$precision" --out "precisions-$precision" --strategies \
    fsdp,fsdp+sharding_strategy=SHARD_GRAD_OP,deepspeed_stage_1,deepspeed_stage_2,deepspeed_stage_3,model_parallel \
    > precisions.txt 2>&1 || { cat precisions.txt; echo "FAIL: loom-bench at $precision failed"; exit 1; }
done
# A cell per run on 4 ranks: one cell's pooled buffers (a bf16 shard's
# float32 copy, 1 KiB) may be freed while a later cell is counted.
mesh=0
for precision in 32-true bf16-mixed; do
  for cell in ddp fsdp+sharding_strategy=HYBRID_SHARD+device_mesh_replicate=2+device_mesh_shard=2 \
    model_parallel+data_parallel_size=2+tensor_parallel_size=2; do
    mesh=$((mesh + 1))
    timeout 60 "$bench" $tiny --world-sizes 4 --precisions "$precision" --out "meshes-$mesh" --strategies "$cell" \
      > meshes.txt 2>&1 || { cat meshes.txt; echo "FAIL: loom-bench $cell at 4 ranks failed"; exit 1; }
  done
done
/usr/bin/python3 - precisions-*/loom-bench.json meshes-*/loom-bench.json <<'EOF'
import json, sys
# An earlier cell's scalar (a loss: 4 bytes) may be freed while a cell is counted:
# a state may read up to 16 bytes low (seen once: 4 bytes).
scalars = 16
cells = [c for path in sys.argv[1:] for c in json.load(open(path))["cells"]]
problems = []
shard_psi = (16 * 32 + 32 + 2 * (32 * 32 + 32) + 32 * 4 + 4) // 2  # one shard of every unit at S = 2
for c in cells:
    where = f"{c['cell']} at {c['precision']}, {c['world_size']} ranks"
    if c["refused"]:
        problems.append(f"{where} was refused: {c['refused']}")
        continue
    # Pooled receive buffers the formulas leave out: tensor parallel's one
    # activation; the two-rank exchange's across HYBRID_SHARD's 2 replicas.
    slack = 8 * 32 * 4 if c["cell"].startswith("model_parallel") else 4 * shard_psi if "HYBRID" in c["cell"] else 0
    if c["payload_formula_bytes"] is None or c["payload_bytes_per_step"] != c["payload_formula_bytes"] or \
            c["state_formula_bytes"] is None or \
            not c["state_formula_bytes"] - scalars <= c["state_bytes"] <= c["state_formula_bytes"] + slack:
        problems.append(f"{where}: payload {c['payload_bytes_per_step']}, formula {c['payload_formula_bytes']}; "
                        f"state {c['state_bytes']}, formula {c['state_formula_bytes']}")
print("\n".join(problems) if problems else
      f"formulas: {len(cells)} cells at bf16-mixed, bf16-true and on 2-D meshes carry and hold their formulas' bytes")
sys.exit(1 if problems else 0)
EOF

# bench/allreduce.sh's cell: one kind, with c10d's allreduce beside loom's.
timeout 60 "$bench" --fit-network raw.json --fit-kinds all_reduce --fit-raw-baseline --fit-sizes 4096,65536 \
  --fit-rounds 2 --fit-calls 1 > raw.txt 2>&1 || { cat raw.txt; echo "FAIL: --fit-raw-baseline failed"; exit 1; }
/usr/bin/python3 - raw.json <<'EOF'
import json, sys
net = json.load(open(sys.argv[1]))
kinds = sorted((s["collective"], s["payload_bytes"]) for s in net["samples"])
want = [("all_reduce", 4096.0), ("all_reduce", 65536.0), ("c10d_allreduce", 4096.0), ("c10d_allreduce", 65536.0)]
if kinds != want or set(net["collectives"]) != {"all_reduce"} or any(s["seconds"] <= 0 for s in net["samples"]):
    sys.exit(f"FAIL: --fit-kinds all_reduce --fit-raw-baseline gave {kinds}, fitted {sorted(net['collectives'])}")
EOF
echo "--fit-network: a network file --network reads back; a bad one is refused; --fit-raw-baseline measures both"

# bench/zero_offload.sh's cell: an NVMe offload stream's bytes and throughput.
mkdir nvme
nvme_cell="deepspeed_stage_3_offload_nvme+nvme_path=$work/nvme+sub_group_size=256+block_size=4096+queue_depth=4"
timeout 60 "$bench" $small --world-sizes 2 --replays 1 --strategies "$nvme_cell" --out nvme > nvme.txt 2>&1 ||
  { cat nvme.txt; echo "FAIL: an NVMe offload cell failed"; exit 1; }
/usr/bin/python3 - nvme.txt nvme/loom-bench.json <<'EOF'
import json, sys
text, cells = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))["cells"]
io = cells[0]["nvme"] if len(cells) == 1 and not cells[0]["refused"] else None
if io is None or "NVMe offload per step" not in text:
    sys.exit(f"FAIL: the NVMe cell reports no offload figures: {cells}")
if not (io["read_bytes_per_step"] > 0 and io["written_bytes_per_step"] > 0 and io["read_mb_per_s"] > 0
        and io["read_mb_per_s_all_ranks"] >= io["read_mb_per_s"]
        and io["write_mb_per_s_all_ranks"] >= io["write_mb_per_s"]):
    sys.exit(f"FAIL: the NVMe figures do not add up: {io}")
EOF
echo "NVMe offload: bytes per step and throughput, rank 0 and summed over the ranks"

if [ -n "$model_library" ]; then
  timeout 60 "$bench" --model-library "$model_library" --model-options layers=1,dim=32,heads=2,context=16 \
    --batch 4 --steps 6 --warmup 1 --block 3 --replays 2 --world-sizes 2 --strategies raw,ddp,fsdp,model_parallel \
    --out library > library.txt 2>&1 || { cat library.txt; echo "FAIL: loom-bench --model-library failed"; exit 1; }
  /usr/bin/python3 - library.txt library/loom-bench.json <<'EOF'
import json, sys
# An earlier cell's scalar (a loss: 4 bytes) may be freed while a cell is counted:
# a state may read up to 16 bytes low (seen once: 4 bytes).
scalars = 16
text, cells = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))["cells"]
problems = []
header = [l for l in text.splitlines() if l.startswith("loom-bench on ")]
if not header or "char transformer: 1 block(s), dim 32, 2 heads, context 16 bytes" not in header[0]:
    problems.append(f"the header does not name the library's model: {header}")
for c in cells:
    where = f"{c['cell']} (model library)"
    if c["refused"] or c["steps"] != 6 or c["step_ms"]["median"] <= 0:
        problems.append(f"{where}: refused {c['refused']!r}, steps {c['steps']}")
    elif c["cell"] == "model_parallel" and (c["payload_formula_bytes"] is not None or
                                            c["state_formula_bytes"] is not None):
        problems.append(f"{where}: a formula for a plan that is the library's")
    elif c["cell"] != "model_parallel" and (c["payload_bytes_per_step"] != c["payload_formula_bytes"] or
                                            (c["state_formula_bytes"] is None) != (c["cell"] == "ddp") or
                                            c["cell"] != "ddp" and
                                            abs(c["state_bytes"] - c["state_formula_bytes"]) > scalars):
        problems.append(f"{where}: payload {c['payload_bytes_per_step']}, formula {c['payload_formula_bytes']}; "
                        f"state {c['state_bytes']}, formula {c['state_formula_bytes']}")
    elif c["cell"] != "raw" and (c["collectives_per_step"] < 1 or sum(p for _, p in c["step_collectives"]) !=
                                 c["payload_bytes_per_step"]):
        problems.append(f"{where}: collectives {c['collectives_per_step']}, trace {c['step_collectives']}")
if sorted(c["cell"] for c in cells) != ["ddp", "fsdp", "model_parallel", "raw"]:
    problems.append(f"cells: {[c['cell'] for c in cells]}")
print("\n".join(problems) if problems else
      "model library: the char transformer trains under 4 cells at 2 ranks, within its formulas")
sys.exit(1 if problems else 0)
EOF
  status=0
  timeout 30 "$bench" --model-library "$loom_run" --world-sizes 1 --strategies raw --steps 2 --out '' \
    > not-library.txt 2>&1 || status=$?
  if [ "$status" -eq 0 ] || ! grep -q "cannot be loaded" not-library.txt; then
    cat not-library.txt
    echo "FAIL: a file that is not a model library was not refused (exit $status)"
    exit 1
  fi
else
  echo "model library: not built (examples off), not run"
fi

timeout 30 "$loom_plot" --bench matrix/loom-bench.csv -o matrix.svg ||
  { echo "FAIL: loom-plot --bench failed"; exit 1; }
/usr/bin/python3 - matrix.svg matrix/loom-bench.json <<'EOF'
import json, sys, xml.etree.ElementTree as ET
svg = ET.parse(sys.argv[1]).getroot()
rows = [g for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "cell"]
measured = [c for c in json.load(open(sys.argv[2]))["cells"] if not c["refused"]]
bars = [r for r in rows if len([e for e in r if e.tag.endswith("rect")]) >= 3]
print(f"loom-plot --bench: {len(rows)} bar rows for {len(measured)} measured cells")
sys.exit(0 if len(rows) == len(bars) == len(measured) else 1)
EOF

timeout 60 "$loom_run" --devices 2 bench $small --strategies raw,ddp,fsdp --out '' > launched.txt 2>&1 ||
  { cat launched.txt; echo "FAIL: loom-run --devices 2 bench failed"; exit 1; }
if [ "$(grep -c '^| ' launched.txt)" -ne 8 ] || [ "$(grep -c '^| ddp | 32-true | 2 |' launched.txt)" -ne 2 ]; then
  cat launched.txt
  echo "FAIL: loom-run bench: not the two tables of 3 cells at 2 ranks (rank 0 alone prints)"
  exit 1
fi
echo "loom-run bench: one table, 3 cells at 2 ranks"

# Units of 561, 1088 and 165 parameters: padded to 561, 1089 and 165 at 3 ranks.
timeout 60 "$bench" --widths 16,33,32,5 --batch 8 --steps 4 --warmup 1 --world-sizes 3 --out padded \
  --strategies fsdp,fsdp+sharding_strategy=SHARD_GRAD_OP,deepspeed_stage_1,deepspeed_stage_2,deepspeed_stage_3 \
  > padded.txt 2>&1 ||
  { cat padded.txt; echo "FAIL: loom-bench at 3 ranks failed"; exit 1; }
/usr/bin/python3 - padded/loom-bench.json <<'EOF'
import json, sys
# An earlier cell's scalar (a loss: 4 bytes) may be freed while a cell is counted:
# a state may read up to 16 bytes low (seen once: 4 bytes).
scalars = 16
cells = json.load(open(sys.argv[1]))["cells"]
wrong = [c for c in cells if c["refused"] or c["payload_bytes_per_step"] != c["payload_formula_bytes"]
         or abs(c["state_bytes"] - c["state_formula_bytes"]) > scalars]
for c in wrong:
    print(f"{c['cell']} at 3 ranks: {c['refused'] or ''} payload {c['payload_bytes_per_step']}, formula "
          f"{c['payload_formula_bytes']}; state {c['state_bytes']}, formula {c['state_formula_bytes']}")
print(f"padded units at 3 ranks: {len(cells) - len(wrong)} of {len(cells)} cells carry the formula's payload and "
      "hold the formula's state")
sys.exit(1 if wrong or len(cells) != 5 else 0)
EOF

# --optimizer sgd (no optimizer state): every state formula's K is 0; the
# peers train with SGD too.
timeout 60 "$bench" $small --world-sizes 2 --optimizer sgd --out sgd \
  --strategies raw,fsdp,fsdp+sharding_strategy=SHARD_GRAD_OP,deepspeed_stage_1,model_parallel,torch_ddp \
  > sgd.txt 2>&1 || { cat sgd.txt; echo "FAIL: loom-bench --optimizer sgd failed"; exit 1; }
/usr/bin/python3 - sgd/loom-bench.json <<'EOF'
import json, sys
# An earlier cell's scalar (a loss: 4 bytes) may be freed while a cell is counted:
# a state may read up to 16 bytes low (seen once: 4 bytes).
scalars = 16
cells = json.load(open(sys.argv[1]))["cells"]
slack = lambda c: 8 * 32 * 4 if c["cell"] == "model_parallel" else 0
wrong = [c for c in cells if c["refused"] or (not c["peer"] and not (
    c["state_formula_bytes"] is not None and
    c["state_formula_bytes"] - scalars <= c["state_bytes"] <= c["state_formula_bytes"] + slack(c)))]
for c in wrong:
    print(f"{c['cell']} with SGD: {c['refused']} state {c['state_bytes']}, formula {c['state_formula_bytes']}")
print(f"--optimizer sgd: {len(cells) - len(wrong)} of {len(cells)} cells hold the formula's state (K = 0) or ran")
sys.exit(1 if wrong or len(cells) != 6 else 0)
EOF

# ddp under bf16-true on Gloo (which moves no bfloat16) is refused with what
# works, on both ranks, before any collective; fsdp runs.
timeout 60 "$bench" $small --world-sizes 2 --precisions bf16-true --strategies ddp,fsdp --out '' > bf16.txt 2>&1 ||
  { cat bf16.txt; echo "FAIL: loom-bench at bf16-true failed"; exit 1; }
if ! grep -q '^| ddp | bf16-true | 2 | refused: ddp: the module holds BFloat16 tensors, which Gloo cannot' bf16.txt ||
    ! grep -q '^| fsdp | bf16-true | 2 | [0-9]' bf16.txt; then
  cat bf16.txt
  echo "FAIL: ddp at bf16-true on Gloo was not refused with what works (or fsdp did not run)"
  exit 1
fi
echo "bf16-true: ddp refused with what works, fsdp ran"

# mpirun (a TCP rendezvous): one loom cell besides raw runs; two are refused
# up front with what to do instead, not left waiting on each other.
timeout 60 mpirun --allow-run-as-root --oversubscribe -n 2 "$bench" $small --strategies raw,fsdp --out '' \
  > mpirun.txt 2>&1 || { cat mpirun.txt; echo "FAIL: loom-bench under mpirun failed"; exit 1; }
grep -q '^| fsdp | 32-true | 2 | [0-9]' mpirun.txt || { cat mpirun.txt; echo "FAIL: no fsdp row under mpirun"; exit 1; }
status=0
timeout 60 mpirun --allow-run-as-root --oversubscribe -n 2 "$bench" $small --strategies ddp,fsdp --out '' \
  > mpirun2.txt 2>&1 || status=$?
if [ "$status" -eq 0 ] || ! grep -q "runs one loom cell besides raw" mpirun2.txt; then
  cat mpirun2.txt
  echo "FAIL: two loom cells under mpirun were not refused (exit $status)"
  exit 1
fi
echo "mpirun: one cell runs, two are refused with what to do"

timeout 60 "$bench" --one-rank-overhead --steps 10 --warmup 2 --out '' > one.txt 2>&1 ||
  { cat one.txt; echo "FAIL: --one-rank-overhead failed"; exit 1; }
last=$(tail -n 1 one.txt)
echo "$last" | grep -Eq '^worst_one_rank_ratio=[0-9]+\.[0-9]{4} strategy=[a-z_0-9+=A-Z]+$' ||
  { cat one.txt; echo "FAIL: --one-rank-overhead's last line is '$last'"; exit 1; }
echo "one-rank overhead: $last"

timeout 60 "$bench" --strategies 'raw,fsdp+sharding_strategy' --world-sizes 1 --steps 2 --warmup 0 --out '' \
  > bad.txt 2>&1 || true
grep -q "is not KEY=VALUE" bad.txt ||
  { cat bad.txt; echo "FAIL: a malformed cell was not refused with what is accepted"; exit 1; }
echo "ok"
