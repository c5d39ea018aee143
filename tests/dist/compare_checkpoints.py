"""compare_checkpoints.py A B: Python's torch.load opens both checkpoint files
(loom's single-file format) and every entry is equal, tensors bit for bit
(what `loom-run consolidate` writes against a full save of the same state).
Debian's python3-torch 1.13 (weights_only cannot read floats in 1.13)."""
import sys

import torch


def same(a, b, where):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{where}: a tensor on one side only"]
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            return [f"{where}: tensors differ ({tuple(a.shape)} vs {tuple(b.shape)})"]
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        problems = []
        if set(a) != set(b):
            problems.append(f"{where}: keys {sorted(map(str, set(a) ^ set(b)))} on one side only")
        for key in set(a) & set(b):
            problems += same(a[key], b[key], f"{where}[{key!r}]")
        return problems
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: lengths {len(a)} and {len(b)}"]
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in same(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


first = torch.load(sys.argv[1])
second = torch.load(sys.argv[2])
# The metadata says who wrote each (a consolidation, a full save): compare the rest.
for checkpoint in (first, second):
    checkpoint.pop("__loom__", None)
problems = same(first, second, "checkpoint")
tensors = sum(1 for e in first.values() if isinstance(e, dict) for v in e.values() if isinstance(v, torch.Tensor))
if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"python torch.load: {len(first)} entries equal, module tensors compared: {tensors}")
