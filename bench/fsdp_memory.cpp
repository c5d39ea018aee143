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
//
//   OMP_NUM_THREADS=1 build/bench/fsdp_memory 2
#include "fsdp_model.hpp"

#include <loom/loom.hpp>

#include <c10/core/CPUAllocator.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

namespace {

// Counts the live bytes of every CPU tensor allocation, and their peak.
class counting_allocator final : public c10::Allocator {
 public:
  explicit counting_allocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t bytes) LOOM_ALLOCATOR_ALLOCATE_CONST override {
    auto* record = new allocation{inner_->allocate(bytes), bytes, this};
    const auto now = live_.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
    auto peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    void* data = record->inner.get();
    return {data, record, &release, record->inner.device()};
  }
#if LOOM_ALLOCATOR_NEEDS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#endif
  std::int64_t live() const { return live_.load(); }
  std::int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }

 private:
  struct allocation {
    c10::DataPtr inner;
    size_t bytes;
    const counting_allocator* owner;
  };
  static void release(void* context) {
    auto* record = static_cast<allocation*>(context);
    record->owner->live_.fetch_sub(static_cast<std::int64_t>(record->bytes));
    delete record;
  }
  c10::Allocator* inner_;
  mutable std::atomic<std::int64_t> live_{0};
  mutable std::atomic<std::int64_t> peak_{0};
};

counting_allocator* counter = nullptr;

// The RSS high-water mark since the last reset (Linux: clear_refs 5).
void reset_rss_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }
std::int64_t rss_peak_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return -1;
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  static counting_allocator installed(c10::GetCPUAllocator());
  counter = &installed;
  c10::SetCPUAllocator(counter, /*priority=*/100);
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
    fabric.barrier();
    const std::int64_t before = counter->live();
    counter->reset_peak();
    reset_rss_peak();
    at::manual_seed(0);
    loom_bench::WideMlp net;
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
    auto [model, optimizer] = fabric.setup(net, adam);
    const std::int64_t setup_peak = counter->peak() - before;
    const std::int64_t setup_rss = rss_peak_bytes();
    auto step = [&] {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(inputs), targets);
      fabric.backward(loss);
      optimizer.step();
    };
    for (int s = 0; s < 3; ++s) step();  // Adam's state exists from the first step
    const std::int64_t held_b = counter->live() - before;
    // (a): each storage once.
    std::set<const void*> seen;
    std::int64_t held_a = 0;
    auto count = [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (seen.insert(t.storage().unsafeGetStorageImpl()).second) held_a += static_cast<std::int64_t>(t.storage().nbytes());
    };
    for (const auto& p : net->parameters()) {
      count(p);
      count(p.grad());
    }
    for (const auto& [key, per_parameter] : adam.state()) {
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*per_parameter);
      count(s.exp_avg());
      count(s.exp_avg_sq());
      count(s.max_exp_avg_sq());
    }
    auto& engine = *model.session().state();
    for (const auto& t : engine.held_tensors()) count(t);
    // The formula, plus the padding the flat buffers carry.
    std::int64_t padding = 0;
    for (const auto& unit : engine.units()) padding += unit.padded - unit.numel;
    double formula = 0;
    switch (strategy) {
      case loom::sharding_strategy::full_shard: formula = 16 * psi / n + 8.0 * padding / n; break;
      case loom::sharding_strategy::shard_grad_op: formula = 4 * psi + 12 * psi / n + 4.0 * padding + 4.0 * padding / n; break;
      default: formula = 16 * psi; break;
    }
    counter->reset_peak();
    reset_rss_peak();
    step();
    const std::int64_t step_peak = counter->peak() - before - held_b;
    const std::int64_t step_rss = rss_peak_bytes();
    if (report) {
      std::printf("%-14s %9.2f MiB %9.2f MiB %9.2f MiB %9.4f %9.4f %10.2f MiB %10.2f MiB %10.2f MiB %10.2f MiB\n",
                  std::string(loom::to_string(strategy)).c_str(), mib(held_a), mib(held_b),
                  mib(static_cast<std::int64_t>(formula)), static_cast<double>(held_a) / static_cast<double>(held_b),
                  static_cast<double>(held_b) / formula, mib(step_peak), mib(step_rss), mib(setup_peak),
                  mib(setup_rss));
      std::fflush(stdout);
    }
  }
  if (report) {
    std::printf("(step peak: live bytes during one step above what is held between steps; setup peak: during "
                "build + setup, above the count before the model; RSS: the process's high-water mark in each phase)\n");
    std::printf("largest unit: %.2f MiB of parameters (fc2, fc3: 1,049,600 each)\n", mib(4 * 1'049'600));
  }
  std::fflush(stdout);
  launcher.barrier();
  return 0;
}
