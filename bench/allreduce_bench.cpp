// loom's all_reduce against raw c10d's allreduce on the same tensors, 1 KiB
// to 64 MiB, Gloo on loopback. Run it under loom-run on 2 ranks:
//
//   OMP_NUM_THREADS=1 build/tools/loom-run --devices 2 build/bench/allreduce_bench
//
// Both ranks run the same fixed schedule of collectives: for each size, a
// fixed number of rotating triples of calls (loom's all_reduce_, c10d's
// allreduce on the same Gloo backend, and that raw call again), each call
// timed alone. Rank 0 prints one line per size: both medians and their ratio,
// and the ratio of the second raw series to the first: the noise floor of the
// machine in the same run.
#include <loom/compat_c10d.hpp>
#include <loom/loom.hpp>

#include "median.hpp"

#include "comm/process_group_state.hpp"  // loom's group's c10d backend (src/, not installed)

#include <algorithm>
#include <string>
#include <thread>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using loom_bench::median;

}  // namespace

int main() {
  loom::Fabric<loom::cpu, loom::parallel> fabric;
  fabric.launch();
  const int rank = fabric.global_rank();
  const int world = fabric.world_size();
  if (world < 2) {
    std::fprintf(stderr, "allreduce_bench: run it under loom-run --devices 2 (world size is %d)\n", world);
    return 2;
  }
  // The raw baseline: c10d's allreduce on the very Gloo backend loom's world
  // group drives (same sockets, same threads), so the two sides differ only by
  // what loom adds. A second raw series on it gives the noise floor.
  auto raw = fabric.strategy().group().state()->backend;
  auto& control = raw;

  struct size_plan {
    const char* label;
    int64_t bytes;
    int iterations;
  };
  const std::vector<size_plan> plan = {
      {"1KiB", 1 << 10, 3000},    {"4KiB", 4 << 10, 3000},   {"16KiB", 16 << 10, 3000}, {"64KiB", 64 << 10, 2000},
      {"256KiB", 256 << 10, 1500}, {"1MiB", 1 << 20, 1000},  {"4MiB", 4 << 20, 400},    {"16MiB", 16 << 20, 150},
      {"64MiB", 64 << 20, 60},
  };
  if (rank == 0) std::printf("all_reduce, %d ranks, Gloo on loopback, float32, median per call over rotating triples (loom, raw, raw2)\n", world);
  for (const auto& size : plan) {
    // One tensor for all three series: the same memory, so placement and
    // cache effects cannot favour a side.
    at::Tensor loom_tensor = at::ones({size.bytes / 4});
    std::vector<at::Tensor> raw_tensors{loom_tensor};
    std::vector<at::Tensor> control_tensors{loom_tensor};
    std::vector<double> loom_times, raw_times, control_times, copy_times;
    auto time_one = [](auto&& call) {
      const auto start = std::chrono::steady_clock::now();
      call();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    auto loom_call = [&] { fabric.all_reduce_(loom_tensor); };
    auto raw_call = [&] { raw->allreduce(raw_tensors)->wait(); };
    auto control_call = [&] { control->allreduce(control_tensors)->wait(); };
    // Warm-up, then calls in rotating triples, each timed alone: drift and
    // noise fall on every side alike.
    loom_call();
    raw_call();
    control_call();
    fabric.barrier();
    for (int turn = 0; turn < size.iterations; ++turn) {
      // Rotate the order: loom, raw, control / raw, control, loom / control, loom, raw.
      for (int slot = 0; slot < 3; ++slot) {
        switch ((turn + slot) % 3) {
          case 0: loom_times.push_back(time_one(loom_call)); break;
          case 1: raw_times.push_back(time_one(raw_call)); break;
          default: control_times.push_back(time_one(control_call)); break;
        }
      }
    }
    // The out-of-place form (returns a new tensor; the copy is its cost).
    for (int call = 0; call < std::max(3, size.iterations / 10); ++call) {
      copy_times.push_back(time_one([&] { (void)fabric.all_reduce(loom_tensor); }));
    }
    if (rank == 0) {
      const double loom_us = median(loom_times) * 1e6;
      const double raw_us = median(raw_times) * 1e6;
      const double control_us = median(control_times) * 1e6;
      // Ratios within each triple, whose calls ran moments apart: slow
      // stretches of the machine fall on both sides of one ratio.
      std::vector<double> paired, paired_control;
      for (std::size_t i = 0; i < loom_times.size(); ++i) {
        paired.push_back(loom_times[i] / raw_times[i]);
        paired_control.push_back(control_times[i] / raw_times[i]);
      }
      std::printf("size=%-7s calls=%-5d loom_us=%9.1f raw_us=%9.1f ratio=%.3f paired=%.3f | noise raw2/raw: ratio=%.3f "
                  "paired=%.3f | copy_us=%.1f\n",
                  size.label, size.iterations, loom_us, raw_us, loom_us / raw_us, median(paired), control_us / raw_us,
                  median(paired_control), median(copy_times) * 1e6);
      std::fflush(stdout);
    }
  }
  fabric.barrier();
  return 0;
}
