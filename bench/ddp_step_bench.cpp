// loom's half of bench/ddp_vs_torch.sh: DDP training steps of MLP
// 784-256-256-10, batch 64 per rank, SGD, fp32, Gloo on loopback. Rank 0
// prints one line per measured step: step_ms (zero_grad through step),
// forward_ms, backward_ms, optimizer_ms; then, for the time breakdown, steps
// whose backward runs under no_backward_sync (compute only) and all-reduces
// of the whole gradient as one tensor.
//
//   OMP_NUM_THREADS=1 build/tools/loom-run --strategy ddp --devices 2 build/bench/ddp_step_bench [STEPS]
#include "step_model.hpp"

#include <loom/environment.hpp>
#include <loom/loom.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {
using clock_type = std::chrono::steady_clock;
double ms(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  constexpr int warmup = 50;
  // LOOM_BENCH_BACKEND=mpi: the MPI process group (bench/ddp_mpi_vs_gloo.sh).
  const bool mpi = loom::cluster::setting_text("LOOM_BENCH_BACKEND").value_or("") == "mpi";
  loom::Fabric<loom::cpu, loom::ddp, loom::fp32> fabric(
      {}, loom::ddp(loom::ddp_options{.process = {.backend = mpi ? loom::comm::backend::mpi : loom::comm::backend::gloo}}));
  fabric.launch();
  const bool report = fabric.is_global_zero();
  at::manual_seed(0);
  loom_bench::Mlp net;
  torch::optim::SGD sgd(net->parameters(), 0.01);
  auto [model, optimizer] = fabric.setup(net, sgd);
  at::manual_seed(1 + fabric.global_rank());
  const auto inputs = at::randn({64, 784});
  const auto targets = at::randint(0, 10, {64});

  for (int step = 0; step < warmup + steps; ++step) {
    const auto t0 = clock_type::now();
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(inputs), targets);
    const auto t1 = clock_type::now();
    fabric.backward(loss);
    const auto t2 = clock_type::now();
    optimizer.step();
    const auto t3 = clock_type::now();
    if (report && step >= warmup) {
      std::printf("step_ms=%.4f forward_ms=%.4f backward_ms=%.4f optimizer_ms=%.4f\n", ms(t0, t3), ms(t0, t1),
                  ms(t1, t2), ms(t2, t3));
    }
  }
  // Compute only: backward without gradient synchronisation.
  for (int step = 0; step < steps / 2; ++step) {
    auto guard = fabric.no_backward_sync(model);
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(inputs), targets);
    const auto t1 = clock_type::now();
    fabric.backward(loss);
    const auto t2 = clock_type::now();
    if (report) std::printf("nosync_backward_ms=%.4f\n", ms(t1, t2));
  }
  // The communication alone: the gradient's size as one all-reduce.
  int64_t numel = 0;
  for (const auto& p : net->parameters()) numel += p.numel();
  at::Tensor flat = at::zeros({numel});
  for (int call = 0; call < steps / 2; ++call) {
    fabric.barrier();
    const auto t1 = clock_type::now();
    fabric.all_reduce_(flat);
    const auto t2 = clock_type::now();
    if (report) std::printf("allreduce_ms=%.4f\n", ms(t1, t2));
  }
  std::fflush(stdout);
  return 0;
}
