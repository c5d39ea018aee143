// The program behind bench/zero_offload.sh: ZeRO stage 3 with the optimizer
// state and the parameter partitions on NVMe (Lightning's
// deepspeed_stage_3_offload_nvme: offload_optimizer and offload_param
// device "nvme" in NVME_DIR), MLP
// 784-1024-1024-1024-10, batch 64 per rank, Adam, fp32, Gloo on loopback.
// sub_group_size is a tenth of a rank's partition (so >= 8 sub-groups),
// buffer_count 4, aio block_size 1 MiB, queue_depth 8. Each rank prints one
// line per measured step: step_ms, and its optimizer stream's read and write
// throughput in that step (bytes / the time with at least one request of
// that kind in flight), MB/s (10^6 bytes). The reads are the step's
// (parameters and state per sub-group) and the gathers' (each unit's
// parameter partition, in forward and in backward); the writes the step's.
//
//   OMP_NUM_THREADS=1 build/tools/loom-run --strategy deepspeed_stage_3 --devices 2 build/bench/zero_offload_bench NVME_DIR [STEPS]
#include "fsdp_model.hpp"

#include <loom/loom.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  const std::string nvme_path = argc > 1 ? argv[1] : "/tmp";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 30;
  constexpr int warmup = 5;
  const std::int64_t sub_group = loom_bench::wide_mlp_parameters / 2 / 10;
  // deepspeed_stage_3_offload_nvme's settings (that name cannot be started
  // from the command line, Lightning's rule for offload variants).
  loom::deepspeed_options options{.stage = 3,
                                  .offload_optimizer = true,
                                  .offload_parameters = true,
                                  .offload_params_device = "nvme",
                                  .offload_optimizer_device = "nvme",
                                  .nvme_path = nvme_path,
                                  .optimizer_buffer_count = 4,
                                  .block_size = 1 << 20,
                                  .queue_depth = 8,
                                  .sub_group_size = sub_group};
  loom::Fabric<loom::cpu, loom::deepspeed_stage_3, loom::fp32> fabric({}, loom::deepspeed_stage_3(options));
  fabric.launch();
  at::manual_seed(1 + fabric.global_rank());
  const auto inputs = at::randn({64, 784});
  const auto targets = at::randint(0, 10, {64});
  at::manual_seed(0);
  loom_bench::WideMlp net;
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto [model, optimizer] = fabric.setup(net, adam);
  const auto& counters = fabric.strategy().nvme()->counters();
  for (int s = 0; s < warmup + steps; ++s) {
    const auto before = counters;
    const auto t0 = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    fabric.backward(torch::nn::functional::cross_entropy(model(inputs), targets));
    optimizer.step();
    const auto t1 = std::chrono::steady_clock::now();
    if (s >= warmup) {
      const double read_s = counters.read_busy_seconds - before.read_busy_seconds;
      const double write_s = counters.write_busy_seconds - before.write_busy_seconds;
      const auto read_b = static_cast<double>(counters.bytes_read - before.bytes_read);
      const auto write_b = static_cast<double>(counters.bytes_written - before.bytes_written);
      std::printf("rank=%d step_ms=%.4f read_MBps=%.1f write_MBps=%.1f read_MB=%.2f written_MB=%.2f sub_groups=%llu "
                  "partition_reads=%llu\n",
                  fabric.global_rank(), std::chrono::duration<double, std::milli>(t1 - t0).count(), read_b / read_s / 1e6,
                  write_b / write_s / 1e6, read_b / 1e6, write_b / 1e6,
                  static_cast<unsigned long long>(counters.sub_groups),
                  static_cast<unsigned long long>(counters.shard_loads - before.shard_loads));
    }
  }
  std::fflush(stdout);
  fabric.barrier();
  return 0;
}
