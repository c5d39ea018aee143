"""loom-bench's PyTorch peers: the same MLP, batch, optimizer (Adam, lr 1e-3, or SGD, lr 0.01)
and step, in PyTorch (Debian's python3-torch), trained side by side in the
same processes, interleaved in blocks of steps as loom-bench's cells are:

    torch_ddp    DistributedDataParallel + Adam
    torch_zero1  DistributedDataParallel + ZeroRedundancyOptimizer(Adam): PyTorch's ZeRO-1

OMP_NUM_THREADS threads per rank (loom-bench passes what loom-run gives
loom's ranks), denormals flushed to zero (as loom-bench's cells), Gloo.
Ranks are started with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT;
rank 0 writes the cells as loom-bench's JSON (no collective or memory
counts: PyTorch has no loom counters).

    /usr/bin/python3 torch_peer.py --widths 784,1024,1024,1024,10 --batch 64 --steps 200 \\
        --warmup 20 --block 10 --cells torch_ddp,torch_zero1 --results FILE
"""
import argparse
import json
import os
import platform
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

PEERS = ("torch_ddp", "torch_zero1")


class Mlp(torch.nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x


def spread(values):
    """Median, 10th and 90th percentile, interpolated as loom-bench's spread_of."""
    values = sorted(values)

    def quantile(q):
        position = q * (len(values) - 1)
        below = int(position)
        above = min(below + 1, len(values) - 1)
        return values[below] + (position - below) * (values[above] - values[below])

    return {"median": quantile(0.5), "p10": quantile(0.1), "p90": quantile(0.9)}


def rss_peak_mib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--block", type=int, required=True)
    parser.add_argument("--cells", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    cells = args.cells.split(",")
    for cell in cells:
        if cell not in PEERS:
            raise SystemExit(f"torch_peer.py: unknown peer '{cell}'; accepted: {', '.join(PEERS)}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_flush_denormal(True)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    runners = []
    for cell in cells:
        torch.manual_seed(0)
        model = DistributedDataParallel(Mlp(widths))
        # loom-bench's --optimizer: Adam (lr 1e-3) or plain SGD (lr 0.01).
        kind, lr = (torch.optim.SGD, 0.01) if args.optimizer == "sgd" else (torch.optim.Adam, 1e-3)
        if cell == "torch_zero1":
            optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=kind, lr=lr)
        else:
            optimizer = kind(model.parameters(), lr=lr)
        runners.append({"cell": cell, "model": model, "optimizer": optimizer,
                        "step": [], "forward": [], "backward": [], "optimizer_ms": [], "off_cpu": []})
    torch.manual_seed(1 + rank)
    inputs = torch.randn(args.batch, widths[0])
    targets = torch.randint(0, widths[-1], (args.batch,))
    clock = time.perf_counter

    def step(runner, record):
        c0 = time.thread_time()
        t0 = clock()
        runner["optimizer"].zero_grad()
        loss = F.cross_entropy(runner["model"](inputs), targets)
        t1 = clock()
        loss.backward()
        t2 = clock()
        runner["optimizer"].step()
        t3 = clock()
        c3 = time.thread_time()
        if record:
            runner["off_cpu"].append(max(0.0, (t3 - t0) - (c3 - c0)) * 1e3)
            runner["step"].append((t3 - t0) * 1e3)
            runner["forward"].append((t1 - t0) * 1e3)
            runner["backward"].append((t2 - t1) * 1e3)
            runner["optimizer_ms"].append((t3 - t2) * 1e3)

    for runner in runners:
        for _ in range(args.warmup):
            step(runner, False)
    for done in range(0, args.steps, args.block):
        for runner in runners:
            for _ in range(min(args.block, args.steps - done)):
                step(runner, True)
    if rank == 0:
        out = []
        for runner in runners:
            step_ms = spread(runner["step"])
            out.append({"cell": runner["cell"], "precision": "32-true", "world_size": world_size, "refused": "",
                        "steps": len(runner["step"]), "step_ms": step_ms,
                        "forward_ms": spread(runner["forward"])["median"],
                        "backward_ms": spread(runner["backward"])["median"],
                        "optimizer_ms": spread(runner["optimizer_ms"])["median"],
                        "off_cpu_ms": spread(runner["off_cpu"])["median"],
                        "samples": {"step": runner["step"], "forward": runner["forward"],
                                    "backward": runner["backward"], "optimizer": runner["optimizer_ms"],
                                    "off_cpu": runner["off_cpu"]},
                        "samples_per_second": args.batch * world_size / (step_ms["median"] / 1e3),
                        "rss_peak_mib": rss_peak_mib(), "peer": True})
        with open(args.results, "w") as results:
            json.dump({"machine": platform.processor(), "cells": out}, results)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
