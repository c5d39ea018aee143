"""PyTorch's half of bench/zero_vs_torch.sh: MLP 784-1024-1024-1024-10 (as
bench/fsdp_model.hpp), batch 64 per rank, fp32, Gloo on loopback, one thread,
trained two ways in the same processes, interleaved in blocks of 10 steps:
torch_zero1 = DDP + ZeroRedundancyOptimizer(Adam) (PyTorch's ZeRO-1, which
facts-sharding.md measured at 40.6-43.4 ms/step here) and torch_ddp_adam =
DDP + Adam. Timed over zero_grad through step; rank 0 prints one line per
measured step: config=NAME step_ms=...  Ranks are started with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT.

    /usr/bin/python3 bench/zero_torch.py [STEPS]
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel


class WideMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 1024)
        self.fc2 = torch.nn.Linear(1024, 1024)
        self.fc3 = torch.nn.Linear(1024, 1024)
        self.fc4 = torch.nn.Linear(1024, 10)

    def forward(self, x):
        return self.fc4(torch.relu(self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))))


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    warmup, block = 20, 10
    torch.set_num_threads(1)
    # As bench/fsdp_step_bench.cpp's ZeRO set: denormals flushed to zero (one
    # fixed batch drives the gradients into them, and their arithmetic is
    # many times slower on x86).
    torch.set_flush_denormal(True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    runners = []
    for name in ("torch_zero1", "torch_ddp_adam"):
        torch.manual_seed(0)
        model = DistributedDataParallel(WideMlp())
        if name == "torch_zero1":
            optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
        else:
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        runners.append((name, model, optimizer))
    torch.manual_seed(1 + rank)
    inputs = torch.randn(64, 784)
    targets = torch.randint(0, 10, (64,))
    clock = time.perf_counter

    def step(name, model, optimizer, report):
        t0 = clock()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        t1 = clock()
        if report and rank == 0:
            print(f"config={name} step_ms={(t1 - t0) * 1e3:.4f}")

    for runner in runners:
        for _ in range(warmup):
            step(*runner, False)
    for _ in range(0, steps, block):
        for runner in runners:
            for _ in range(block):
                step(*runner, True)
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
