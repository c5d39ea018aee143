// One training step (forward, cross-entropy, backward, SGD step) of MLP
// 784-256-256-10, batch 64, raw LibTorch vs through loom::Fabric, measured in
// one run with random interleaving, and the same step through make_fabric's
// AnyFabric against the static Fabric; the ratios of the medians are printed last.
//
//   OMP_NUM_THREADS=1 build/bench/loom_bench --benchmark_repetitions=10
#include "step_model.hpp"

#include <benchmark/benchmark.h>
#include <loom/any_fabric.hpp>
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

void BM_step_raw(benchmark::State& state) {
  at::manual_seed(0);
  step_data data;
  Mlp model;
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  for (auto _ : state) {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(data.inputs), data.targets);
    loss.backward();
    optimizer.step();
  }
}

// One step through a fabric: the loop every Fabric entry times.
template <class FabricType>
void step_through(benchmark::State& state, FabricType& fabric) {
  at::manual_seed(0);
  step_data data;
  Mlp net;
  torch::optim::SGD sgd(net->parameters(), 0.01);
  auto [model, optimizer] = fabric.setup(net, sgd);
  for (auto _ : state) {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(data.inputs), data.targets);
    fabric.backward(loss);
    optimizer.step();
  }
}

template <class Precision>
void step_through_fabric(benchmark::State& state) {
  loom::Fabric<loom::cpu, loom::single_device, Precision> fabric;
  step_through(state, fabric);
}

void BM_step_fabric(benchmark::State& state) { step_through_fabric<loom::fp32>(state); }

// The same step with the combination chosen from strings (one indirect call
// per forward, backward, zero_grad and step).
void BM_step_anyfabric(benchmark::State& state) {
  auto fabric = loom::make_fabric({.accelerator = "cpu", .strategy = "single_device", .precision = "32-true"});
  step_through(state, fabric);
}

void BM_step_raw_bf16_autocast(benchmark::State& state) {
  at::manual_seed(0);
  step_data data;
  Mlp model;
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  for (auto _ : state) {
    optimizer.zero_grad();
    at::Tensor loss;
    {
      raw_cpu_autocast autocast;
      loss = torch::nn::functional::cross_entropy(model->forward(data.inputs), data.targets);
    }
    loss.backward();
    optimizer.step();
  }
}

void BM_step_fabric_bf16_mixed(benchmark::State& state) { step_through_fabric<loom::bf16_mixed>(state); }

BENCHMARK(BM_step_raw)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_step_fabric)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_step_anyfabric)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_step_raw_bf16_autocast)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_step_fabric_bf16_mixed)->Unit(benchmark::kMicrosecond);

// The console output, then one line per pair: the ratio of median real times.
class ratio_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& reports) override {
    ConsoleReporter::ReportRuns(reports);
    for (const auto& run : reports) {
      const std::string& name = run.run_name.function_name;
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name == "median") {
        medians_[name] = run.GetAdjustedRealTime();
      } else if (run.run_type == Run::RT_Iteration && run.repetitions <= 1) {
        medians_[name] = run.GetAdjustedRealTime();  // a single run is its own median
      }
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    ratio("BM_step_fabric", "BM_step_raw");
    ratio("BM_step_anyfabric", "BM_step_fabric");
    ratio("BM_step_fabric_bf16_mixed", "BM_step_raw_bf16_autocast");
  }

 private:
  void ratio(const std::string& ours, const std::string& baseline) {
    if (!medians_.count(ours) || !medians_.count(baseline)) return;
    std::printf("ratio %s / %s (median real time) = %.4f  (%.1f us vs %.1f us)\n", ours.c_str(), baseline.c_str(),
                medians_[ours] / medians_[baseline], medians_[ours], medians_[baseline]);
  }
  std::map<std::string, double> medians_;
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
  if (std::getenv("OMP_NUM_THREADS") == nullptr) at::set_num_threads(1);
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  ratio_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
