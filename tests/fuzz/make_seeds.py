"""Seeds for loom's fuzzers, made by Debian's python3-torch and by hand.

make_seeds.py DIR [LOOM_SEEDS]: writes DIR/<target>/ for every target of
tests/fuzz/targets.hpp:
  - real files: torch.save checkpoints (protocol 2, several dtypes, a plain
    state dict, an Adam state dict, an OrderedDict, protocol 4), the pickle
    inside each (and inside loom's own, from LOOM_SEEDS: the files
    `loom_tests [.write_fuzz_seeds]` wrote), IDX files plain and gzipped, the
    examples' DeepSpeed config;
  - forged files of each class the hardened readers refuse (see
    docs/checkpoints.md, "Loading files you did not write"), so each
    fuzzer starts from every refusal path.
Run with /usr/bin/python3 (Debian's torch); tests/fuzz/make_seeds.sh calls it.
"""
import gzip
import io
import json
import shutil
import struct
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

import torch

out = Path(sys.argv[1])
loom_seeds = Path(sys.argv[2]) if len(sys.argv) > 2 else None
targets = ["pickle", "archive", "load", "sharded_index", "sharded_rank", "deepspeed_index", "zero_config", "idx"]
for target in targets:
    (out / target).mkdir(parents=True, exist_ok=True)


def put(target, name, data):
    (out / target / name).write_bytes(data)


def saved(value, **options):
    buffer = io.BytesIO()
    torch.save(value, buffer, **options)
    return buffer.getvalue()


def pickle_of(archive_bytes):
    with zipfile.ZipFile(io.BytesIO(archive_bytes)) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))


def archive_of(pickle, records=()):
    """A torch zip archive as torch.save lays one out: archive/data.pkl, archive/data/N."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickle)
        for i, record in enumerate(records):
            archive.writestr(f"archive/data/{i}", record)
        archive.writestr("archive/version", b"3\n")
    return buffer.getvalue()


# ---------------------------------------------------------------- real files
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
model(torch.ones(2, 4)).sum().backward()
optimizer.step()
real = {
    "state_dict": saved(dict(model.state_dict())),
    "ordered": saved(model.state_dict()),
    "adam": saved({"optimizer": optimizer.state_dict(), "step": 3}),
    "dtypes": saved({name: torch.arange(6).to(dtype).reshape(2, 3)
                     for name, dtype in [("f32", torch.float32), ("f64", torch.float64), ("f16", torch.float16),
                                         ("bf16", torch.bfloat16), ("i64", torch.int64), ("i32", torch.int32),
                                         ("u8", torch.uint8), ("bool", torch.bool)]}),
    "views": saved({"w": torch.arange(12.0).reshape(3, 4)[1:, ::2], "shared": [torch.zeros(2)] * 2}),
    "values": saved({"step": 7, "lr": 0.5, "name": "mlp", "flag": True, "ints": [1, 2, 3], "one": [1], "d": {"a": 1}}),
    "protocol4": saved({"w": torch.ones(2)}, pickle_protocol=4),
}
for name, data in real.items():
    put("archive", f"torch_{name}.pt", data)
    put("load", f"torch_{name}.pt", data)
    put("pickle", f"torch_{name}.pkl", pickle_of(data))
if loom_seeds is not None:
    for target in targets:
        for path in sorted((loom_seeds / target).glob("*")):
            shutil.copy(path, out / target / f"loom_{path.name}")
    put("pickle", "loom_checkpoint.pkl", pickle_of((loom_seeds / "load" / "loom.ckpt").read_bytes()))

# ---------------------------------------------------------------- forged pickles, one per class
forged = {
    "global_os_system": b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.",
    "global_builtins_eval": b"\x80\x04\x8c\x08builtins\x94\x8c\x04eval\x94\x93\x94\x8c\x031+1\x85R.",
    "global_inst": b"(X\x02\x00\x00\x00lsios\nsystem\n.",
    "global_ext1": b"\x80\x02\x82\x01.",
    "deep_lists": b"\x80\x02" + b"]" * 100000 + b"a" * 99999 + b".",
    "deep_marks": b"\x80\x02" + b"(" * 5000 + b"t" * 5000 + b".",
    "cycle": b"\x80\x02]q\x00h\x00a.",
    "cycle_dup": b"\x80\x02]2a.",
    "memo_index": b"\x80\x02]r\xff\xff\xff\x7f.",
    "memo_unset": b"\x80\x02h\x05.",
    "length_wraps": b"\x80\x02\x8d\xf5\xff\xff\xff\xff\xff\xff\xff.",
    "amplified": b"\x80\x02]q\x00(" + b"K\x01" * 10000 + b"e0](" + b"h\x00" * 10000 + b"e.",
    "setitems_without_mark": b"\x80\x02}K\x01K\x02u.",
    "setitems_odd": b"\x80\x02}(K\x01u.",
    "setitems_odd_in_list": b"\x80\x02](}(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00bue.",
    "pop_mark": b"\x80\x02(0.",
    "truncated": b"\x80\x02X\x10\x00\x00\x00abc",
}
for name, pickle in forged.items():
    put("pickle", f"forged_{name}.pkl", pickle)
    put("archive", f"forged_{name}.pt", archive_of(pickle))
    put("load", f"forged_{name}.pt", archive_of(pickle))

# Tensor views that do not fit their record: numel, sizes, offset forged.
honest = pickle_of(saved({"w": torch.arange(6.0).reshape(2, 3)}))
record = torch.arange(6.0).numpy().tobytes()
views = {
    "storage_larger": honest.replace(b"K\x06tq", b"J\x00\x00\x00\x10tq", 1),
    "sizes_larger": honest.replace(b"K\x02K\x03\x86", b"K\x02K\x09\x86", 1),
    "offset_past": honest.replace(b"K\x00K\x02K\x03\x86", b"K\x05K\x02K\x03\x86", 1),
    "huge_view": honest.replace(b"K\x02K\x03\x86", b"J\x40\x42\x0f\x00J\x40\x42\x0f\x00\x86", 1),
    "record_short": honest,
}
for name, pickle in views.items():
    records = [record[:8]] if name == "record_short" else [record]
    put("archive", f"forged_view_{name}.pt", archive_of(pickle, records))
    put("load", f"forged_view_{name}.pt", archive_of(pickle, records))

# A zip whose directory declares a huge record, and one whose record is listed twice.
zipped = bytearray(real["state_dict"])
directory = zipped.rfind(b"PK\x01\x02")
struct.pack_into("<I", zipped, directory + 24, 0xFFFFFFF0)  # uncompressed size of the last entry
put("archive", "forged_zip_huge_size.pt", bytes(zipped))
zipped = bytearray(real["state_dict"])
end = zipped.rfind(b"PK\x05\x06")
first = zipped.find(b"PK\x01\x02")
entry_length = 46 + struct.unpack_from("<H", zipped, first + 28)[0] + struct.unpack_from("<H", zipped, first + 30)[0]
entries = struct.unpack_from("<H", zipped, end + 10)[0]
doubled = zipped[:end] + zipped[first:first + entry_length] + zipped[end:]
struct.pack_into("<HHI", doubled, end + entry_length + 8, entries + 1, entries + 1, len(zipped[first:end]) + entry_length)
put("archive", "forged_zip_listed_twice.pt", bytes(doubled))

# ---------------------------------------------------------------- DeepSpeed configs
config = Path(__file__).resolve().parents[2] / "examples" / "ds_config_stage3.json"
put("zero_config", "ds_config_stage3.json", config.read_bytes())
put("zero_config", "minimal.json", b'{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4}')
put("zero_config", "every_section.json", json.dumps({
    "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "zero_optimization": {
        "stage": 3, "contiguous_gradients": True, "overlap_comm": True, "reduce_scatter": True,
        "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8, "sub_group_size": 1e9,
        "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e5,
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/nvme", "buffer_count": 4, "pin_memory": True,
                              "fast_init": False, "ratio": 1.0},
        "offload_param": {"device": "cpu", "buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e9,
                          "pin_memory": False}},
    "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": False,
            "overlap_events": True},
    "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False,
                                 "contiguous_memory_optimization": False, "number_checkpoints": None,
                                 "synchronize_checkpoint_boundary": False, "profile": False},
    "fp16": {"enabled": False, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": False}}).encode())
for name, config in {"batch_and_micro": {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4},
                     "batch_only": {"train_batch_size": 32, "gradient_accumulation_steps": 2},
                     "fp16": {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12}},
                     "bf16": {"bf16": {"enabled": True}},
                     "fp16_and_bf16": {"fp16": {"enabled": True}, "bf16": {"enabled": True}}}.items():
    put("zero_config", f"{name}.json", json.dumps(config).encode())
put("zero_config", "forged_duplicate_key.json", b'{"zero_optimization": {"stage": 2, "stage": 3}}')
put("zero_config", "forged_deep.json", b'{"zero_optimization": ' + b"[" * 100000 + b"]" * 100000 + b"}")
put("zero_config", "forged_overflow.json",
    b'{"train_micro_batch_size_per_gpu": 4611686018427387904, "gradient_accumulation_steps": 4}')

# ---------------------------------------------------------------- IDX files
def idx(dtype_code, dims, data):
    return b"\x00\x00" + bytes([dtype_code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data


images = idx(0x08, [2, 3, 3], bytes(range(18)))
put("idx", "images.idx", images)
put("idx", "images.idx.gz", gzip.compress(images))
put("idx", "labels.idx", idx(0x08, [4], bytes([1, 2, 3, 4])))
put("idx", "floats.idx", idx(0x0D, [2], struct.pack(">ff", 0.5, 1.5)))
put("idx", "forged_declares_huge.idx", idx(0x08, [65536, 65536, 65536], b"abc"))
put("idx", "forged_declares_huge.idx.gz", gzip.compress(idx(0x08, [65536, 65536], b"abc")))
put("idx", "forged_bad_type.idx", idx(0x0E, [2], b"ab"))
print(f"seeds written under {out}")
