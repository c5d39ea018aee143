"""PyTorch's half of bench/ddp_vs_torch.sh: the same DDP training step as
bench/ddp_step_bench.cpp (MLP 784-256-256-10, batch 64 per rank, SGD, fp32,
Gloo on loopback, DDP's default buckets: 25 MiB cap, 1 MiB first bucket),
timed over the same span (zero_grad through step). Ranks are started with
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; rank 0 prints one line per
measured step, then the same breakdown lines as loom's bench.

    /usr/bin/python3 bench/ddp_torch.py [STEPS]
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 256)
        self.fc2 = torch.nn.Linear(256, 256)
        self.fc3 = torch.nn.Linear(256, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    warmup = 50
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Mlp()
    model = DistributedDataParallel(net, bucket_cap_mb=25)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    inputs = torch.randn(64, 784)
    targets = torch.randint(0, 10, (64,))
    clock = time.perf_counter
    for step in range(warmup + steps):
        t0 = clock()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        t1 = clock()
        loss.backward()
        t2 = clock()
        optimizer.step()
        t3 = clock()
        if rank == 0 and step >= warmup:
            print(f"step_ms={(t3 - t0) * 1e3:.4f} forward_ms={(t1 - t0) * 1e3:.4f} "
                  f"backward_ms={(t2 - t1) * 1e3:.4f} optimizer_ms={(t3 - t2) * 1e3:.4f}")
    for _ in range(steps // 2):
        with model.no_sync():
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)
            t1 = clock()
            loss.backward()
            t2 = clock()
        if rank == 0:
            print(f"nosync_backward_ms={(t2 - t1) * 1e3:.4f}")
    flat = torch.zeros(sum(p.numel() for p in net.parameters()))
    for _ in range(steps // 2):
        dist.barrier()
        t1 = clock()
        dist.all_reduce(flat)
        t2 = clock()
        if rank == 0:
            print(f"allreduce_ms={(t2 - t1) * 1e3:.4f}")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
