// The fixed-shape collectives sharding needs, against a same-size all_reduce
// on the same group: loom's reduce_scatter_into and all_gather_into (Gloo:
// point-to-point exchange, and the alltoall / list all_gather fallbacks),
// 1 MiB to 64 MiB of float32. Run it under loom-run:
//
//   OMP_NUM_THREADS=1 build/tools/loom-run --devices 2 build/bench/collectives_bench [ROUNDS] [CALLS]
//
// Every rank runs the same schedule: for each round, for each size, each
// operation in turn makes CALLS calls, each after a barrier and timed alone
// on rank 0 (interleaving the operations, so a slow phase of the shared
// machine hits them alike). A figure is the median over all rounds' calls.
// "Size" is the all_reduce's buffer: reduce_scatter_into reduces it into
// 1/N-th, all_gather_into fills it from 1/N-th.
#include <loom/loom.hpp>

#include "median.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace {

using loom_bench::median;

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 20;
  loom::Fabric<loom::cpu, loom::parallel> fabric;
  fabric.launch();
  auto& group = fabric.strategy().group();
  const int rank = group.rank();
  const int world = group.size();
  if (world < 2) {
    std::fprintf(stderr, "collectives_bench: run it under loom-run --devices N, N >= 2 (world size is %d)\n", world);
    return 2;
  }
  using loom::comm::emulation;
  struct operation {
    const char* name;
    int kind;  // 0 all_reduce, 1 reduce_scatter_into, 2 all_gather_into
    emulation how;
  };
  const std::vector<operation> operations = {
      {"all_reduce", 0, emulation::point_to_point},
      {"reduce_scatter_into", 1, emulation::point_to_point},
      {"all_gather_into", 2, emulation::point_to_point},
      {"reduce_scatter_into/alltoall", 1, emulation::alltoall},
      {"all_gather_into/list_all_gather", 2, emulation::alltoall},
  };
  const std::vector<std::pair<const char*, int64_t>> sizes = {
      {"1MiB", 1 << 20}, {"4MiB", 4 << 20}, {"16MiB", 16 << 20}, {"64MiB", 64 << 20}};

  std::map<std::pair<std::string, std::string>, std::vector<double>> times;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& [label, bytes] : sizes) {
      const int64_t numel = bytes / 4 / world * world;
      at::Tensor full = at::ones({numel});
      at::Tensor part = at::ones({numel / world});
      for (const auto& op : operations) {
        group.set_emulation(op.how);
        for (int call = -1; call < calls; ++call) {  // call -1 warms the buffers
          group.barrier();
          const auto start = std::chrono::steady_clock::now();
          if (op.kind == 0) group.all_reduce(full);
          else if (op.kind == 1) group.reduce_scatter_into(part, full).wait();
          else group.all_gather_into(full, part).wait();
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
          if (call >= 0) times[{label, op.name}].push_back(ms);
          full.fill_(1.0);
        }
      }
    }
  }
  if (rank == 0) {
    std::printf("%d ranks, Gloo on loopback, float32; median ms per call over %d interleaved rounds of %d calls, "
                "and the ratio to a same-size all_reduce\n", world, rounds, calls);
    std::printf("%-7s %-33s %10s %8s\n", "size", "operation", "median_ms", "ratio");
    std::map<std::string, double> ratio_16;
    for (const auto& [label, bytes] : sizes) {
      const double reference = median(times[{label, "all_reduce"}]);
      for (const auto& op : operations) {
        const double value = median(times[{label, op.name}]);
        std::printf("%-7s %-33s %10.3f %8.3f\n", label, op.name, value, value / reference);
        if (std::string(label) == "16MiB") ratio_16[op.name] = value / reference;
      }
    }
    std::printf("ranks=%d reduce_scatter_vs_allreduce=%.3f all_gather_vs_allreduce=%.3f\n", world,
                ratio_16["reduce_scatter_into"], ratio_16["all_gather_into"]);
  }
  fabric.barrier();
  return 0;
}
