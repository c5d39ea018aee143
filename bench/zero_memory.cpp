// bench/zero_memory N: bytes per rank of MLP 784-1024-1024-1024-10 (Ψ =
// 2,913,290 parameters, each Linear a unit: a bucket) with fp32 Adam under
// ZeRO stages 1, 2 and 3 on N ranks (started by fabric.launch()), measured
// as bench/memory_probe.hpp says (held (a): storages reachable from module,
// optimizer and engine; held (b): a counting allocator's live bytes), on
// rank 0, against the fp32 formulas of facts-sharding.md §4 plus the padding
// of the flat buffers:
//   stage 1: 8Ψ + 8Ψ/N   (parameters and gradients whole, Adam state sharded)
//   stage 2: 4Ψ + 12Ψ/N  (parameters whole, gradients and Adam state sharded)
//   stage 3: 16Ψ/N       (everything sharded)
// and under bf16-mixed (DeepSpeed's bf16 mode: bf16 parameters and gradients,
// fp32 master partition and Adam state) the mixed-precision ones:
//   stage 1: 4Ψ + 12Ψ/N, stage 2: 2Ψ + 14Ψ/N, stage 3: 16Ψ/N
//
//   OMP_NUM_THREADS=1 build/bench/zero_memory 2
#include "memory_probe.hpp"

#include <loom/loom.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

using loom_bench::mib;

int main(int argc, char** argv) {
  auto& counter = loom_bench::install_counting_allocator();
  const int devices = argc > 1 ? std::atoi(argv[1]) : 2;
  using zero_fabric = loom::Fabric<loom::cpu, loom::deepspeed, loom::fp32>;
  zero_fabric launcher({.devices = loom::devices_spec(devices)});
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
    std::printf("%-8s %-12s %12s %12s %12s %9s %9s %6s %14s %14s\n", "stage", "formula", "held (a)", "held (b)",
                "formula+pad", "(a)/(b)", "(b)/form", "<=5%", "step peak", "setup peak");
  }
  bool all_within = true;
  auto row = [&](const std::string& label, const char* written, const loom_bench::memory_probe& m, double formula) {
    const double ratio = static_cast<double>(m.held_b) / formula;
    const bool within = std::abs(ratio - 1.0) <= 0.05 && std::abs(static_cast<double>(m.held_a) / formula - 1.0) <= 0.05;
    all_within = all_within && within;
    if (report) {
      std::printf("%-8s %-12s %8.2f MiB %8.2f MiB %8.2f MiB %9.4f %9.4f %6s %10.2f MiB %10.2f MiB\n", label.c_str(),
                  written, mib(m.held_a), mib(m.held_b), mib(static_cast<std::int64_t>(formula)),
                  static_cast<double>(m.held_a) / static_cast<double>(m.held_b), ratio, within ? "yes" : "NO",
                  mib(m.step_peak), mib(m.setup_peak));
      std::fflush(stdout);
    }
  };
  for (int stage : {1, 2, 3}) {
    zero_fabric fabric({}, loom::deepspeed(loom::deepspeed_options{.stage = stage}));
    const auto m = loom_bench::probe_memory(fabric, counter, inputs, targets);
    const double pad = static_cast<double>(m.padding);
    const double formula = stage == 1   ? 8 * psi + 8 * psi / n + 8 * pad
                           : stage == 2 ? 4 * psi + 12 * psi / n + 4 * pad + 4 * pad / n
                                        : 16 * psi / n + 8 * pad / n;
    row(std::to_string(stage), stage == 1 ? "8P + 8P/N" : stage == 2 ? "4P + 12P/N" : "16P/N", m, formula);
  }
  // bf16-mixed (DeepSpeed's bf16 mode): bf16 parameters and gradients, an
  // fp32 master partition and fp32 Adam state (the paper's K = 12).
  for (int stage : {1, 2, 3}) {
    loom::Fabric<loom::cpu, loom::deepspeed, loom::bf16_mixed> fabric(
        {}, loom::deepspeed(loom::deepspeed_options{.stage = stage}));
    const auto m = loom_bench::probe_memory(fabric, counter, inputs, targets);
    const double pad = static_cast<double>(m.padding);
    const double formula = stage == 1   ? 4 * psi + 12 * psi / n + 4 * pad
                           : stage == 2 ? 2 * psi + 14 * psi / n + 2 * pad + 2 * pad / n
                                        : 16 * psi / n + 4 * pad / n;
    row(std::to_string(stage) + " bf16", stage == 1 ? "4P + 12P/N" : stage == 2 ? "2P + 14P/N" : "16P/N", m, formula);
  }
  if (report) {
    std::printf("(P = psi; step peak: live bytes during one step above what is held between steps; setup peak: "
                "during build + setup)\nzero_memory N=%d: %s\n",
                n, all_within ? "every stage within 5% of its formula" : "a stage is OFF its formula by more than 5%");
  }
  std::fflush(stdout);
  launcher.barrier();
  return all_within ? 0 : 1;
}
