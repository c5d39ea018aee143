// One training step (forward, cross-entropy, backward, SGD step) of MLP
// 784-256-256-10, batch 64, raw LibTorch vs through loom::Fabric, measured in
// one run with random interleaving, and the same step through make_fabric's
// AnyFabric against the static Fabric; the ratios of the medians are printed last.
//
// The BM_pair_* entries measure the same ratios a second way: each iteration
// times one step of each side back to back (alternating which goes first),
// and the median of the per-iteration ratios is reported. A slow phase of a
// shared machine hits both halves of a pair alike, so these ratios are far
// less noisy than ratios of separately timed medians.
//
//   OMP_NUM_THREADS=1 build/bench/loom_bench --benchmark_repetitions=10
#include "step_model.hpp"

#include <benchmark/benchmark.h>
#include <algorithm>
#include <chrono>
#include <memory>
#include <loom/any_fabric.hpp>
#include <loom/environment.hpp>
#include <loom/loom.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

using loom_bench::Mlp;

namespace {

constexpr int64_t batch = 64;

struct step_data {
  at::Tensor inputs = at::randn({batch, 784});
  at::Tensor targets = at::randint(0, 10, {batch});
};

// The raw loop's autocast, written against LibTorch directly (torch.autocast's
// enter/exit), so the baseline does not share loom's guard.
struct raw_cpu_autocast {
  raw_cpu_autocast() {
    loom::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
    loom::compat::set_autocast_dtype(c10::DeviceType::CPU, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~raw_cpu_autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    loom::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
  }
};

// The raw loop's step, on its own model (the baseline: no loom anywhere).
template <bool Autocast>
struct raw_step {
  raw_step() : optimizer(model->parameters(), 0.01) {}
  void operator()() {
    optimizer.zero_grad();
    at::Tensor loss;
    if constexpr (Autocast) {
      raw_cpu_autocast guard;
      loss = torch::nn::functional::cross_entropy(model->forward(data.inputs), data.targets);
    } else {
      loss = torch::nn::functional::cross_entropy(model->forward(data.inputs), data.targets);
    }
    loss.backward();
    optimizer.step();
  }
  step_data data;
  Mlp model;
  torch::optim::SGD optimizer;
};

// A fabric's step, on its own model: the loop every Fabric entry times.
template <class FabricType>
auto fabric_step(FabricType& fabric) {
  auto data = std::make_shared<step_data>();
  Mlp net;
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), 0.01);
  using setup_t = decltype(fabric.setup(net, *sgd));
  auto wrapped = std::make_shared<setup_t>(fabric.setup(net, *sgd));
  return [data, sgd, wrapped, &fabric] {
    auto& [model, optimizer] = *wrapped;
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(data->inputs), data->targets);
    fabric.backward(loss);
    optimizer.step();
  };
}

template <class Step>
void time_steps(benchmark::State& state, Step&& step) {
  for (auto _ : state) step();
}

template <bool Autocast>
void step_raw(benchmark::State& state) {
  at::manual_seed(0);
  raw_step<Autocast> step;
  time_steps(state, step);
}

template <class Precision>
void step_through_fabric(benchmark::State& state) {
  at::manual_seed(0);
  loom::Fabric<loom::cpu, loom::single_device, Precision> fabric;
  time_steps(state, fabric_step(fabric));
}

void BM_step_raw(benchmark::State& state) { step_raw<false>(state); }
void BM_step_fabric(benchmark::State& state) { step_through_fabric<loom::fp32>(state); }

// The same step with the combination chosen from strings (one indirect call
// per forward, backward, zero_grad and step).
void BM_step_anyfabric(benchmark::State& state) {
  at::manual_seed(0);
  auto fabric = loom::make_fabric({.accelerator = "cpu", .strategy = "single_device", .precision = "32-true"});
  time_steps(state, fabric_step(fabric));
}

void BM_step_raw_bf16_autocast(benchmark::State& state) { step_raw<true>(state); }
void BM_step_fabric_bf16_mixed(benchmark::State& state) { step_through_fabric<loom::bf16_mixed>(state); }

// ------------------------------------------------------------ paired
using bench_clock = std::chrono::steady_clock;

// Times baseline() and candidate() back to back each iteration (alternating
// the order) and reports the median of candidate / baseline as "ratio".
template <class Baseline, class Candidate>
void paired_ratio(benchmark::State& state, Baseline&& baseline, Candidate&& candidate) {
  std::vector<double> ratios;
  ratios.reserve(1 << 14);
  bool candidate_first = false;
  auto timed = [](auto& step) {
    const auto start = bench_clock::now();
    step();
    return std::chrono::duration<double>(bench_clock::now() - start).count();
  };
  for (auto _ : state) {
    double base = 0, cand = 0;
    if (candidate_first) {
      cand = timed(candidate);
      base = timed(baseline);
    } else {
      base = timed(baseline);
      cand = timed(candidate);
    }
    candidate_first = !candidate_first;
    ratios.push_back(cand / base);
  }
  std::sort(ratios.begin(), ratios.end());
  state.counters["ratio"] = ratios.empty() ? 0.0 : ratios[ratios.size() / 2];
}

// A static Fabric's step against the raw loop's (with autocast for the mixed precisions).
template <class Precision>
void pair_fabric_vs_raw(benchmark::State& state) {
  at::manual_seed(0);
  raw_step<Precision::is_mixed> raw;
  loom::Fabric<loom::cpu, loom::single_device, Precision> fabric;
  paired_ratio(state, raw, fabric_step(fabric));
}

void BM_pair_fabric_vs_raw(benchmark::State& state) { pair_fabric_vs_raw<loom::fp32>(state); }
void BM_pair_fabric_bf16_mixed_vs_raw_autocast(benchmark::State& state) {
  pair_fabric_vs_raw<loom::bf16_mixed>(state);
}

void BM_pair_anyfabric_vs_fabric(benchmark::State& state) {
  at::manual_seed(0);
  loom::Fabric<loom::cpu, loom::single_device, loom::fp32> fabric;
  auto any = loom::make_fabric({.accelerator = "cpu", .strategy = "single_device", .precision = "32-true"});
  paired_ratio(state, fabric_step(fabric), fabric_step(any));
}

BENCHMARK(BM_step_raw)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_step_fabric)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_step_anyfabric)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_step_raw_bf16_autocast)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_step_fabric_bf16_mixed)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_pair_fabric_vs_raw)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_pair_anyfabric_vs_fabric)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_pair_fabric_bf16_mixed_vs_raw_autocast)->Unit(benchmark::kMicrosecond);

// The console output, then one line per pair: the ratio of median real times.
class ratio_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& reports) override {
    ConsoleReporter::ReportRuns(reports);
    for (const auto& run : reports) {
      const std::string& name = run.run_name.function_name;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;  // its own median
      if (median || single) {
        medians_[name] = run.GetAdjustedRealTime();
        if (auto it = run.counters.find("ratio"); it != run.counters.end()) paired_[name] = it->second.value;
      }
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    ratio("BM_step_fabric", "BM_step_raw");
    ratio("BM_step_anyfabric", "BM_step_fabric");
    ratio("BM_step_fabric_bf16_mixed", "BM_step_raw_bf16_autocast");
    for (const auto& [name, value] : paired_) {
      std::printf("paired %s: median of per-step ratios (median over repetitions) = %.4f\n", name.c_str(), value);
    }
  }

 private:
  void ratio(const std::string& ours, const std::string& baseline) {
    if (!medians_.count(ours) || !medians_.count(baseline)) return;
    std::printf("ratio %s / %s (median real time) = %.4f  (%.1f us vs %.1f us)\n", ours.c_str(), baseline.c_str(),
                medians_[ours] / medians_[baseline], medians_[ours], medians_[baseline]);
  }
  std::map<std::string, double> medians_;
  std::map<std::string, double> paired_;
};

bool has_flag(const std::vector<char*>& args, const char* name) {
  for (const char* arg : args) {
    if (std::strncmp(arg, name, std::strlen(name)) == 0) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  // Defaults of this binary: interleaved repetitions (the machines are shared
  // and noisy), ten of them, one intra-op thread unless OMP_NUM_THREADS says.
  std::vector<char*> args(argv, argv + argc);
  static char interleave[] = "--benchmark_enable_random_interleaving=true";
  static char repetitions[] = "--benchmark_repetitions=10";
  if (!has_flag(args, "--benchmark_enable_random_interleaving")) args.insert(args.begin() + 1, interleave);
  if (!has_flag(args, "--benchmark_repetitions")) args.insert(args.begin() + 1, repetitions);
  if (!loom::cluster::process_environment()("OMP_NUM_THREADS")) at::set_num_threads(1);
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  ratio_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
