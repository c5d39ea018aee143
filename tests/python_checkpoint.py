"""The Python half of tests/python_checkpoint.sh, run with Debian's python3-torch.

python_checkpoint.py DIR:
  1. loom.ckpt (fabric.save) opens with torch.load (weights_only: see below); every
     tensor equals LibTorch's own copy in reference.pt, bit for bit; plain
     values are Python values; loom's metadata sits under "__loom__".
  2. The optimizer entry, keyed by parameter name, turns into the positional
     form torch.optim.Adam.load_state_dict takes (the lines docs/checkpoints.md
     shows); Python's next step then equals loom's next step, bit for bit.
  3. Writes python.ckpt (torch.save of a dict: a plain state dict, an Adam
     state_dict with one param group, values, a one-key dict, a one-element
     list; also with pickle protocol 4), python_reference.pt (its tensors, in dicts LibTorch 1.13 reads
     natively) and ordered.ckpt (model.state_dict() as saved by most scripts).
"""
import sys
from collections import OrderedDict
from pathlib import Path

import torch

out = Path(sys.argv[1])
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def mlp():
    return torch.nn.Sequential(OrderedDict(
        fc1=torch.nn.Linear(4, 8), relu1=torch.nn.ReLU(),
        fc2=torch.nn.Linear(8, 8), relu2=torch.nn.ReLU(),
        fc3=torch.nn.Linear(8, 2)))


# 1. loom -> Python. weights_only=True: Debian's torch 1.13 lacks the BINFLOAT
# opcode in its weights-only unpickler (it refuses its own torch.save({'a': 0.5})),
# so the file with floats is checked for what PyTorch >= 2.x's weights_only
# allows (only these globals), and opened with it where it has no floats.
ALLOWED_GLOBALS = {"torch._utils _rebuild_tensor_v2", "collections OrderedDict"}


def globals_of(path):
    import pickletools
    import zipfile
    with zipfile.ZipFile(path) as archive:
        pickle = archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))
    return {str(arg) for op, arg, _ in pickletools.genops(pickle) if op.name in ("GLOBAL", "STACK_GLOBAL")}


for used in globals_of(out / "loom.ckpt"):
    check(used in ALLOWED_GLOBALS or (used.startswith("torch ") and used.endswith("Storage")),
          f"loom.ckpt uses the global {used!r}, which weights_only refuses")
weights = torch.load(out / "weights.ckpt", weights_only=True)
check(set(weights) == {"__loom__", "model", "step"} and weights["step"] == 3, "weights.ckpt with weights_only")
checkpoint = torch.load(out / "loom.ckpt")
reference = torch.load(out / "reference.pt")  # LibTorch's torch::pickle_save: not weights_only
check(set(checkpoint) == {"__loom__", "model", "optimizer", "step", "lr", "name", "flag", "bf16", "ints", "nested"},
      f"keys: {sorted(checkpoint)}")
check(checkpoint["__loom__"]["format_version"] == 2, "format_version")
check(checkpoint["__loom__"]["optimizer_types"] == {"optimizer": "torch::optim::Adam"}, "optimizer_types")
check((checkpoint["step"], checkpoint["lr"], checkpoint["name"], checkpoint["flag"]) == (3, 0.5, "mlp", True), "values")
check(checkpoint["ints"] == [1, 2, 3] and checkpoint["nested"] == {"a": 1}, "list and dict values")
check(checkpoint["bf16"].dtype == torch.bfloat16 and torch.equal(checkpoint["bf16"], reference["bf16"]), "bf16 tensor")
compared = 0
for name, tensor in checkpoint["model"].items():
    check(torch.equal(tensor, reference[f"model.{name}"]), f"model tensor {name}")
    check(torch.equal(weights["model"][name], tensor), f"weights.ckpt tensor {name}")
    compared += 1
state = checkpoint["optimizer"]["state"]
for name in checkpoint["model"]:
    check(torch.equal(state[name]["exp_avg"], reference[f"exp_avg.{name}"]), f"exp_avg {name}")
    check(torch.equal(state[name]["exp_avg_sq"], reference[f"exp_avg_sq.{name}"]), f"exp_avg_sq {name}")
    check(state[name]["step"].item() == 3, f"step {name}")
    compared += 2
group = checkpoint["optimizer"]["param_groups"][0]
check(group["params"] == list(checkpoint["model"]), "params are the parameter names")
check(group["betas"] == (0.8, 0.95) and group["lr"] == 0.01 and group["weight_decay"] == 0.01, f"group {group}")

# 2. The name-keyed optimizer state into torch.optim.Adam, then one step each side.
model = mlp()
model.load_state_dict(checkpoint["model"])
adam = torch.optim.Adam(model.parameters())
named = checkpoint["optimizer"]
names = [name for name, _ in model.named_parameters()]
positional = {
    "state": {names.index(name): value for name, value in named["state"].items()},
    "param_groups": [dict(g, params=[names.index(name) for name in g["params"]]) for g in named["param_groups"]],
}
adam.load_state_dict(positional)
adam.zero_grad()
torch.nn.functional.mse_loss(model(reference["x"]), reference["y"]).backward()
adam.step()
for name, parameter in model.named_parameters():
    expected = reference[f"after_step.{name}"]
    same = torch.equal(parameter.detach(), expected)
    check(same, f"next step {name}: max difference {(parameter.detach() - expected).abs().max().item()}")
    compared += 1

# 3. Python -> loom
torch.manual_seed(3)
model = mlp()
adam = torch.optim.Adam(model.parameters(), lr=0.02, betas=(0.7, 0.9))
x, y = torch.randn(8, 4), torch.randn(8, 2)
for _ in range(2):
    adam.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    adam.step()
for name, protocol in (("python.ckpt", 2), ("python4.ckpt", 4)):  # torch.save's default; 4 is refused clearly
    torch.save({"model": dict(model.state_dict()), "optimizer": adam.state_dict(), "epoch": 5,
                "one_key": {"x": [1]}, "single": [2]}, out / name, pickle_protocol=protocol)
python_reference = {}
for index, (name, parameter) in enumerate(model.named_parameters()):
    python_reference[f"model.{name}"] = parameter.detach().clone()
    python_reference[f"exp_avg.{name}"] = adam.state[parameter]["exp_avg"].clone()
    python_reference[f"exp_avg_sq.{name}"] = adam.state[parameter]["exp_avg_sq"].clone()
torch.save(python_reference, out / "python_reference.pt")
torch.save({"model": model.state_dict(), "epoch": 5}, out / "ordered.ckpt")

if failures:
    print("python_checkpoint: FAILED\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"python_checkpoint: {compared} tensors of loom.ckpt equal bit for bit, Python's next step included")
