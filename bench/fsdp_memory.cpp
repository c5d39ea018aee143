// bench/fsdp_memory N: bytes per rank of MLP 784-1024-1024-1024-10 (Ψ =
// 2,913,290 parameters, each Linear a unit) with fp32 Adam under FSDP
// FULL_SHARD, SHARD_GRAD_OP and NO_SHARD on N ranks (started by
// fabric.launch()). For each, on rank 0:
//   held (a): the distinct storages reachable from the module (parameters,
//     gradients), the optimizer (its state) and the engine (flat shards,
//     gathered buffers), each counted once;
//   held (b): the live bytes of a counting CPU allocator (installed with
//     c10::SetCPUAllocator before anything else), minus its count before the
//     model was built; the batch was made before that count;
//   formula: FULL_SHARD 16Ψ/N, SHARD_GRAD_OP 4Ψ + 12Ψ/N, NO_SHARD 16Ψ, plus
//     the padding of the flat buffers;
//   the peak during a step above what is held, and during build + setup, with
//   the RSS high-water mark of each phase (VmHWM, reset through clear_refs).
// Then FULL_SHARD with the model built inside fabric.init_module(true)
// (sharded construction); the last line is
//   init_peak_mib=X init_bound_mib=Y
// its build + setup peak against 4(Ψ + padding)/N + the largest unit.
//
//   OMP_NUM_THREADS=1 build/bench/fsdp_memory 2
#include "memory_probe.hpp"

#include <loom/loom.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

using loom_bench::mib;

int main(int argc, char** argv) {
  auto& counter = loom_bench::install_counting_allocator();
  const int devices = argc > 1 ? std::atoi(argv[1]) : 2;
  using fsdp_fabric = loom::Fabric<loom::cpu, loom::fsdp, loom::fp32>;
  fsdp_fabric launcher({.devices = loom::devices_spec(devices)});
  launcher.launch();
  const int n = launcher.world_size();
  const bool report = launcher.is_global_zero();
  constexpr double psi = static_cast<double>(loom_bench::wide_mlp_parameters);
  at::manual_seed(1 + launcher.global_rank());
  const auto inputs = at::randn({64, 784});
  const auto targets = at::randint(0, 10, {64});
  if (report) {
    std::printf("MLP 784-1024-1024-1024-10, psi = %.0f parameters (%.2f MiB fp32), fp32 Adam, N = %d ranks, rank 0\n",
                psi, mib(static_cast<std::int64_t>(4 * psi)), n);
    std::printf("%-14s %12s %12s %12s %9s %9s %14s %14s %14s %14s\n", "strategy", "held (a)", "held (b)",
                "formula+pad", "(a)/(b)", "(b)/form", "step peak", "step RSS hwm", "setup peak",
                "setup RSS hwm");
  }
  for (auto strategy : {loom::sharding_strategy::full_shard, loom::sharding_strategy::shard_grad_op,
                        loom::sharding_strategy::no_shard}) {
    fsdp_fabric fabric({}, loom::fsdp(loom::fsdp_options{.strategy = strategy}));
    const auto m = loom_bench::probe_memory(fabric, counter, inputs, targets);
    const std::int64_t padding = m.padding;
    double formula = 0;
    switch (strategy) {
      case loom::sharding_strategy::full_shard: formula = 16 * psi / n + 8.0 * padding / n; break;
      case loom::sharding_strategy::shard_grad_op: formula = 4 * psi + 12 * psi / n + 4.0 * padding + 4.0 * padding / n; break;
      default: formula = 16 * psi; break;
    }
    if (report) {
      std::printf("%-14s %9.2f MiB %9.2f MiB %9.2f MiB %9.4f %9.4f %10.2f MiB %10.2f MiB %10.2f MiB %10.2f MiB\n",
                  std::string(loom::to_string(strategy)).c_str(), mib(m.held_a), mib(m.held_b),
                  mib(static_cast<std::int64_t>(formula)), static_cast<double>(m.held_a) / static_cast<double>(m.held_b),
                  static_cast<double>(m.held_b) / formula, mib(m.step_peak), mib(m.step_rss), mib(m.setup_peak),
                  mib(m.setup_rss));
      std::fflush(stdout);
    }
  }
  // FULL_SHARD with the model built inside init_module(true): each unit
  // sharded as it is built. The bound: this rank's parameter shards and the
  // largest unit, whole while it is built, 4(Ψ + padding)/N + 4 x 1,049,600.
  fsdp_fabric sharded({}, loom::fsdp());
  const auto built = loom_bench::probe_memory(sharded, counter, inputs, targets, /*empty_init=*/true);
  const double init_bound = (4.0 * (psi + static_cast<double>(built.padding)) / n + 4.0 * 1'049'600) / (1 << 20);
  if (report) {
    std::printf("FULL_SHARD built inside init_module(true): setup peak %.2f MiB (RSS hwm %.2f MiB), held %.2f MiB\n",
                mib(built.setup_peak), mib(built.setup_rss), mib(built.held_b));
  }
  if (report) {
    std::printf("(step peak: live bytes during one step above what is held between steps; setup peak: during "
                "build + setup, above the count before the model; RSS: the process's high-water mark in each phase)\n");
    std::printf("largest unit: %.2f MiB of parameters (fc2, fc3: 1,049,600 each)\n", mib(4 * 1'049'600));
    std::printf("init_peak_mib=%.4f init_bound_mib=%.4f\n", mib(built.setup_peak), init_bound);
  }
  std::fflush(stdout);
  launcher.barrier();
  return 0;
}
