// The program behind bench/fsdp_vs_ddp.sh: training steps of MLP
// 784-1024-1024-1024-10 (batch 64 per rank, Adam, fp32, Gloo on loopback)
// under FSDP FULL_SHARD (prefetch on and off), SHARD_GRAD_OP and loom's DDP
// (its two-rank pairwise exchange on) -- or, with LOOM_BENCH_SET=zero, ZeRO
// stages 1, 2 and 3 and DDP (bench/zero_vs_torch.sh) -- interleaved in blocks of 10 steps so
// that the machine's noise falls on all of them alike. Rank 0 prints one
// line per measured step: config=NAME step_ms forward_ms backward_ms
// optimizer_ms (zero_grad is in forward_ms); then compute_ms lines, the same
// step on one process without any collective, for the breakdown.
//
//   OMP_NUM_THREADS=1 build/tools/loom-run --strategy fsdp --devices 2 build/bench/fsdp_step_bench [STEPS]
#include "fsdp_model.hpp"

#include <loom/environment.hpp>
#include <loom/loom.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
double ms(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// One configuration: its Fabric, model and optimizer, and a step.
struct runner {
  std::string name;
  std::function<void(bool report)> step;
};

template <class F>
runner make_runner(std::string name, std::shared_ptr<F> fabric, const at::Tensor& inputs, const at::Tensor& targets) {
  at::manual_seed(0);
  auto net = std::make_shared<loom_bench::WideMlp>();
  auto adam = std::make_shared<torch::optim::Adam>((*net)->parameters(), torch::optim::AdamOptions(1e-3));
  auto [model, optimizer] = fabric->setup(*net, *adam);
  auto state = std::make_shared<std::pair<decltype(model), decltype(optimizer)>>(std::move(model), std::move(optimizer));
  return {name, [=](bool report) {
            auto& [m, o] = *state;
            const auto t0 = clock_type::now();
            o.zero_grad();
            auto loss = torch::nn::functional::cross_entropy(m(inputs), targets);
            const auto t1 = clock_type::now();
            fabric->backward(loss);
            const auto t2 = clock_type::now();
            o.step();
            const auto t3 = clock_type::now();
            (void)net;
            (void)adam;
            if (report) {
              std::printf("config=%s step_ms=%.4f forward_ms=%.4f backward_ms=%.4f optimizer_ms=%.4f\n", name.c_str(),
                          ms(t0, t3), ms(t0, t1), ms(t1, t2), ms(t2, t3));
            }
          }};
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  constexpr int warmup = 20;
  constexpr int block = 10;
  using fsdp_fabric = loom::Fabric<loom::cpu, loom::fsdp, loom::fp32>;
  using ddp_fabric = loom::Fabric<loom::cpu, loom::ddp, loom::fp32>;
  auto full = std::make_shared<fsdp_fabric>(loom::fabric_options{}, loom::fsdp());
  full->launch();
  const bool report = full->is_global_zero();
  at::manual_seed(1 + full->global_rank());
  const auto inputs = at::randn({64, 784});
  const auto targets = at::randint(0, 10, {64});
  // The other configurations join the same processes: loom-run's --strategy
  // names the first one, so its check is lifted for the others.
  ::unsetenv("LT_CLI_USED");
  // LOOM_BENCH_ONLY=NAME runs one configuration alone (to see what interleaving costs);
  // LOOM_BENCH_SET=zero runs ZeRO stages 1, 2 and 3 and DDP (bench/zero_vs_torch.sh).
  const auto only_setting = loom::cluster::setting_text("LOOM_BENCH_ONLY");
  const char* only = only_setting ? only_setting->c_str() : nullptr;
  const bool zero_set = loom::cluster::setting_text("LOOM_BENCH_SET").value_or("") == "zero";
  // The steps train on one fixed batch, so after some tens of steps the
  // gradients reach denormal floats, whose x86 arithmetic is many times
  // slower (measured here: loom's ZeRO-1 step 85 ms with them, 38 ms
  // flushed): the timings would then measure microcode assists, not the
  // strategy. The ZeRO set flushes them to zero, and bench/zero_torch.py
  // does the same on PyTorch's side (torch.set_flush_denormal).
  if (zero_set) at::globalContext().setFlushDenormal(true);
  auto wanted = [only, zero_set](const char* name) {
    const bool zero = std::string(name).rfind("zero", 0) == 0;
    if (only != nullptr) return std::string(only) == name;
    return zero_set ? zero || std::string(name) == "ddp" : !zero;
  };
  std::vector<runner> runners;
  using zero_fabric = loom::Fabric<loom::cpu, loom::deepspeed, loom::fp32>;
  for (int stage : {1, 2, 3}) {
    const std::string name = "zero" + std::to_string(stage);
    if (!wanted(name.c_str())) continue;
    auto zero = std::make_shared<zero_fabric>(loom::fabric_options{},
                                              loom::deepspeed(loom::deepspeed_options{.stage = stage}));
    runners.push_back(make_runner(name, zero, inputs, targets));
  }
  if (wanted("full_shard")) runners.push_back(make_runner("full_shard", full, inputs, targets));
  if (wanted("full_shard_no_prefetch")) {
    auto no_prefetch = std::make_shared<fsdp_fabric>(
        loom::fabric_options{}, loom::fsdp(loom::fsdp_options{.forward_prefetch = false, .backward_prefetch = false}));
    runners.push_back(make_runner("full_shard_no_prefetch", no_prefetch, inputs, targets));
  }
  if (wanted("shard_grad_op")) {
    auto grad_op = std::make_shared<fsdp_fabric>(
        loom::fabric_options{}, loom::fsdp(loom::fsdp_options{.strategy = loom::sharding_strategy::shard_grad_op}));
    runners.push_back(make_runner("shard_grad_op", grad_op, inputs, targets));
  }
  if (only != nullptr && std::string(only) == "ddp_ring") {
    auto ring = std::make_shared<ddp_fabric>(loom::fabric_options{}, loom::ddp(loom::ddp_options{.pairwise_exchange = false}));
    runners.push_back(make_runner("ddp_ring", ring, inputs, targets));
  }
  if (wanted("ddp")) {
    auto ddp = std::make_shared<ddp_fabric>(loom::fabric_options{}, loom::ddp());
    runners.push_back(make_runner("ddp", ddp, inputs, targets));
  }
  for (auto& r : runners) {
    for (int s = 0; s < warmup; ++s) r.step(false);
  }
  for (int done = 0; done < steps; done += block) {
    for (auto& r : runners) {
      for (int s = 0; s < block; ++s) r.step(report);
    }
  }
  // Compute alone: the same step on one process, no collective.
  {
    at::manual_seed(0);
    loom_bench::WideMlp net;
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
    for (int s = 0; s < warmup + steps / 2; ++s) {
      const auto t0 = clock_type::now();
      adam.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(net->forward(inputs), targets);
      const auto t1 = clock_type::now();
      loss.backward();
      const auto t2 = clock_type::now();
      adam.step();
      const auto t3 = clock_type::now();
      if (report && s >= warmup) {
        std::printf("config=compute step_ms=%.4f forward_ms=%.4f backward_ms=%.4f optimizer_ms=%.4f\n", ms(t0, t3),
                    ms(t0, t1), ms(t1, t2), ms(t2, t3));
      }
    }
  }
  std::fflush(stdout);
  full->barrier();
  return 0;
}
