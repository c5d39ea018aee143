"""The cells a bench/ wrapper reads from loom-bench's JSON (--out DIR:
DIR/loom-bench.json), by name; a cell the wrapper needs that loom-bench
refused (or did not run) ends the script with loom-bench's reason."""
import json
import sys


def measured(path, script, names, world_size=None):
    """{cell name: cell} of the file's cells (at world_size, if given);
    exits naming the first of `names` that is missing or refused."""
    cells = {c["cell"]: c for c in json.load(open(path))["cells"]
             if world_size is None or c["world_size"] == world_size}
    for name in names:
        if name not in cells:
            sys.exit(f"{script}: loom-bench ran no {name} in {path}")
        if cells[name]["refused"]:
            sys.exit(f"{script}: loom-bench refused {name}: {cells[name]['refused']}")
    return cells
