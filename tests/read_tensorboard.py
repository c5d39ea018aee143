"""An independent reader of TensorBoard event files, for loom's tests.

It knows nothing of loom's C++: it checks the TFRecord framing with its own
CRC-32C, decodes each record with Python classes that protoc generates from
the .proto (python3-protobuf), applies SessionLog START purges as TensorBoard
does, and compares what it found with expectations.

  read_tensorboard.py --proto DIR --dir RUN_DIR --expect FILE
      FILE lines: "<tag> <step> <value>"   the scalar is there, equal as float32
                  "absent <tag> <step>"    no such scalar
                  "hparam <name> <value>"  a hyperparameter of the session
  read_tensorboard.py --proto DIR --dir RUN_DIR --csv metrics.csv [--columns a,b]
      every value of those columns (default: every column but step) in the
      CSV is in the event files at its step
  read_tensorboard.py --proto DIR --dir RUN_DIR --dump
Exit status 0 when everything matches, 1 with the differences otherwise.
"""
import argparse
import atexit
import csv
import importlib
import math
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path


def crc32c_table():
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


TABLE = crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        if offset + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {offset}")
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if masked(header) != length_crc:
            raise ValueError(f"{path}: bad length CRC at byte {offset}")
        body = data[offset + 12:offset + 12 + length]
        if len(body) != length or offset + 16 + length > len(data):
            raise ValueError(f"{path}: truncated record at byte {offset}")
        (body_crc,) = struct.unpack("<I", data[offset + 12 + length:offset + 16 + length])
        if masked(body) != body_crc:
            raise ValueError(f"{path}: bad data CRC at byte {offset}")
        yield body
        offset += 16 + length


def load_messages(proto_dir):
    out = Path(tempfile.mkdtemp(prefix="loom-tb-"))
    atexit.register(shutil.rmtree, out, True)
    subprocess.run(["protoc", f"--proto_path={proto_dir}", f"--python_out={out}", "loom_tensorboard.proto"],
                   check=True)
    sys.path.insert(0, str(out))
    return importlib.import_module("loom_tensorboard_pb2")


def read_run(messages, run_dir):
    scalars = {}  # tag -> {step: value}
    hparams = {}
    files = sorted(p for p in Path(run_dir).iterdir() if p.name.startswith("events.out.tfevents."))
    if not files:
        raise ValueError(f"no event file in {run_dir}")
    for path in files:
        first = True
        for body in records(path):
            event = messages.Event()
            event.ParseFromString(body)
            if first:
                if event.file_version != "brain.Event:2":
                    raise ValueError(f"{path}: the first event is not file_version brain.Event:2")
                first = False
                continue
            kind = event.WhichOneof("what")
            if kind == "session_log" and event.session_log.status == messages.SessionLog.START:
                for steps in scalars.values():  # TensorBoard drops what follows a restart's step
                    for step in [s for s in steps if s >= event.step]:
                        del steps[step]
            elif kind == "summary":
                for value in event.summary.value:
                    if value.metadata.plugin_data.plugin_name == "hparams":
                        plugin = messages.HParamsPluginData()
                        plugin.ParseFromString(value.metadata.plugin_data.content)
                        if plugin.WhichOneof("data") == "session_start_info":
                            for name, item in plugin.session_start_info.hparams.items():
                                hparams[name] = getattr(item, item.WhichOneof("kind"))
                    elif value.WhichOneof("value") == "simple_value":
                        scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars, hparams


def as_float32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def same(stored, expected):
    if math.isnan(expected):
        return math.isnan(stored)
    return stored == as_float32(expected)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proto", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--expect")
    parser.add_argument("--csv")
    parser.add_argument("--columns", default="")
    parser.add_argument("--dump", action="store_true")
    args = parser.parse_args()
    messages = load_messages(args.proto)
    try:
        scalars, hparams = read_run(messages, args.dir)
    except ValueError as error:
        print(f"read_tensorboard: {error}", file=sys.stderr)
        return 1
    problems = []
    checked = 0
    if args.dump:
        for tag, steps in sorted(scalars.items()):
            print(tag, " ".join(f"{s}:{v}" for s, v in sorted(steps.items())))
        print("hparams", hparams)
    if args.expect:
        for line in Path(args.expect).read_text().splitlines():
            fields = line.split()
            if not fields:
                continue
            checked += 1
            if fields[0] == "absent":
                if int(fields[2]) in scalars.get(fields[1], {}):
                    problems.append(f"{fields[1]} at step {fields[2]} should have been purged")
            elif fields[0] == "hparam":
                name, text = fields[1], fields[2]
                got = hparams.get(name)
                want = {"true": True, "false": False}.get(text, text)
                if isinstance(got, float):
                    want = float(text)
                if got != want:
                    problems.append(f"hparam {name}: {got!r}, expected {want!r}")
            else:
                tag, step, value = fields[0], int(fields[1]), float(fields[2])
                stored = scalars.get(tag, {}).get(step)
                if stored is None:
                    problems.append(f"{tag} at step {step}: missing")
                elif not same(stored, value):
                    problems.append(f"{tag} at step {step}: {stored}, expected {value}")
    if args.csv:
        columns = [c for c in args.columns.split(",") if c]
        with open(args.csv, newline="") as handle:
            reader = csv.DictReader(handle)
            if not columns:
                columns = [c for c in reader.fieldnames if c != "step"]
            for row in reader:
                for column in columns:
                    if row.get(column, "") == "":
                        continue
                    checked += 1
                    step = int(row["step"])
                    stored = scalars.get(column, {}).get(step)
                    if stored is None:
                        problems.append(f"{column} at step {step}: in the CSV, not in the event file")
                    elif not same(stored, float(row[column])):
                        problems.append(f"{column} at step {step}: {stored} in the event file, {row[column]} in the CSV")
        if checked == 0:
            problems.append("the CSV has no values in the columns " + ",".join(columns))
    for problem in problems:
        print("read_tensorboard: " + problem, file=sys.stderr)
    if not problems:
        print(f"read_tensorboard: {checked} expectation(s) met in {args.dir}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
