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
// and stage 3 with the optimizer state on NVMe (NVME_DIR, default /tmp),
// then with the parameter partitions there too (offload_param: only the
// gradient partitions and the buffers stay in memory between steps).
//
//   OMP_NUM_THREADS=1 build/bench/zero_memory 2 [NVME_DIR]
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
  // NVMe offload's directory: on a local disk with direct I/O (not tmpfs).
  const std::string nvme_path = argc > 2 ? argv[2] : "/tmp";
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
  // NVMe optimizer offload (stage 3): sub-groups of sub_group_size elements
  // (a rank's partition spans >= 8 of them), buffer_count 4: the optimizer
  // state resident is the buffers, which must be <= 4 x one sub-group's
  // state; /proc/self/io must grow each step by at least the state's bytes.
  for (bool params : {false, true}) {
    const std::int64_t sub_group = static_cast<std::int64_t>(psi / n / 10);
    loom::deepspeed_options options{.stage = 3,
                                    .offload_optimizer = true,
                                    .offload_parameters = params,
                                    .offload_params_device = params ? "nvme" : "cpu",
                                    .offload_optimizer_device = "nvme",
                                    .nvme_path = nvme_path,
                                    .optimizer_buffer_count = 4,
                                    .sub_group_size = sub_group};
    zero_fabric fabric({}, loom::deepspeed(options));
    const auto m = loom_bench::probe_memory(fabric, counter, inputs, targets);
    const double pad = static_cast<double>(m.padding);
    // What stays in memory besides the buffers: parameter and gradient
    // partitions, or (offload_param) the gradient partitions only.
    const double kept = params ? 4 * psi / n + 4 * pad / n : 8 * psi / n + 8 * pad / n;
    const char* label = params ? "3 nvme+param" : "3 nvme";
    const double resident = static_cast<double>(m.held_b) - kept;
    const double allowed = 4.0 * static_cast<double>(m.nvme_group_bytes);
    // Each step's stream reads and writes the state (and, with offload_param, the parameters).
    const double state = (params ? 12.0 : 8.0) * static_cast<double>(m.partition_elements);
    const bool ok = m.nvme_sub_groups >= 8 && resident <= allowed + 4 * 4096 && m.optimizer_state_empty &&
                    static_cast<double>(m.last_step_io.read) >= state && static_cast<double>(m.last_step_io.written) >= state;
    all_within = all_within && ok;
    if (report) {
      std::printf("%s: %lld sub-groups of %lld elements; resident besides %s (held (b) - that - pad) = "
                  "%.2f MiB <= buffer_count 4 x %.2f MiB = %.2f MiB (+ alignment): %s; optimizer object state empty: "
                  "%s\n", label, static_cast<long long>(m.nvme_sub_groups), static_cast<long long>(sub_group),
                  params ? "the gradients (4P/N)" : "parameters and gradients (8P/N)",
                  mib(static_cast<std::int64_t>(resident)), mib(m.nvme_group_bytes),
                  mib(static_cast<std::int64_t>(allowed)), resident <= allowed + 4 * 4096 ? "yes" : "NO",
                  m.optimizer_state_empty ? "yes" : "NO");
      std::printf("%s: one step moved read_bytes %.2f MiB, write_bytes %.2f MiB (/proc/self/io) for %.2f MiB of "
                  "%s (%s bytes x %lld elements): %s; held (a) %.2f MiB, held (b) %.2f MiB, formula %s + "
                  "buffers %.2f MiB\n", label, mib(m.last_step_io.read), mib(m.last_step_io.written),
                  mib(static_cast<std::int64_t>(state)), params ? "parameters and Adam state" : "Adam state",
                  params ? "12" : "8", static_cast<long long>(m.partition_elements),
                  static_cast<double>(m.last_step_io.read) >= state && static_cast<double>(m.last_step_io.written) >= state
                      ? "yes" : "NO",
                  mib(m.held_a), mib(m.held_b), params ? "4P/N" : "8P/N",
                  mib(static_cast<std::int64_t>(kept) + m.nvme_buffer_bytes));
      std::fflush(stdout);
    }
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
