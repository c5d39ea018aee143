// One training step of a compute-bound transformer block (bench/tp_block.hpp:
// hidden 1024, 16 heads, MLP 4096, sequence 256, batch 8, SGD, fp32) under
// model_parallel with tensor parallel = the world size (1: the single-device
// figure). Rank 0 prints the median step over STEPS measured steps (after one
// of warm-up), the collectives and bytes the tensor-parallel group moved per
// step (from the collective recorder), and the time split: communication is
// those collectives' time measured alone (the same all-reduces, same sizes,
// back to back), compute the rest.
//
//   OMP_NUM_THREADS=1 build/tools/loom-run --devices 2 build/bench/tp_step_bench [STEPS]
#include "median.hpp"
#include "tp_block.hpp"

#include <loom/environment.hpp>

#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {
using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point start) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
}
}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  constexpr int64_t dim = 1024, heads = 16, hidden = 4096, sequence = 256, batch = 8;
  loom::Fabric<loom::cpu, loom::model_parallel, loom::fp32> fabric(
      {}, loom::model_parallel(loom::model_parallel_options{
              .parallelize_fn = [](torch::nn::Module& module, loom::comm::device_mesh& mesh) {
                loom_bench::parallelize_block(module, mesh, /*sequence=*/false);
              }}));
  fabric.launch();
  at::manual_seed(0);
  torch::nn::ModuleHolder<loom_bench::TpBlockImpl<true>> net(dim, heads, hidden);
  torch::optim::SGD sgd(net->parameters(), 1e-3);
  auto [model, optimizer] = fabric.setup(net, sgd);
  loom::comm::process_group& group = fabric.strategy().device_mesh().group("tensor_parallel");
  auto generator = at::detail::createCPUGenerator(1);
  const at::Tensor x = at::randn({batch, sequence, dim}, generator);
  const at::Tensor target = at::randn({batch, sequence, dim}, generator);

  std::vector<double> step_ms;
  std::uint64_t collectives = 0;
  for (int step = 0; step <= steps; ++step) {
    const std::uint64_t before = group.collectives_recorded();
    const auto start = clock_type::now();
    optimizer.zero_grad();
    fabric.backward(torch::mse_loss(model(x), target));
    optimizer.step();
    const double took = ms_since(start);
    if (step > 0) step_ms.push_back(took);  // the first is warm-up
    collectives = group.collectives_recorded() - before;
  }
  // The same collectives alone: all-reduces of one activation ([batch, sequence, dim] floats).
  const int tp = fabric.world_size();
  const double activation_bytes = static_cast<double>(batch * sequence * dim) * 4.0;
  double comm_ms = 0;
  if (tp > 1) {
    at::Tensor activation = at::randn({batch, sequence, dim});
    std::vector<double> alone;
    for (int round = 0; round < 3; ++round) {
      const auto start = clock_type::now();
      for (std::uint64_t k = 0; k < collectives; ++k) group.all_reduce(activation);
      alone.push_back(ms_since(start));
      activation.fill_(1.0);
    }
    comm_ms = loom_bench::median(alone);
  }
  const double median_ms = loom_bench::median(step_ms);
  if (fabric.is_global_zero()) {
    std::printf("tp=%d threads=%s step_ms=%.1f collectives=%llu bytes=%.0f comm_ms=%.1f compute_ms=%.1f\n", tp,
                loom::cluster::setting_text("OMP_NUM_THREADS").value_or("?").c_str(), median_ms,
                static_cast<unsigned long long>(collectives), static_cast<double>(collectives) * activation_bytes,
                comm_ms, median_ms - comm_ms);
  }
  return 0;
}
