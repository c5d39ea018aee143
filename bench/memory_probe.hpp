// What a sharded strategy keeps per rank, measured two ways (bench/fsdp_memory,
// bench/zero_memory):
//   held (a): the distinct storages reachable from the module (parameters,
//     gradients), the optimizer (its state) and the engine (flat shards,
//     gathered buffers), each counted once;
//   held (b): the live bytes of a counting CPU allocator (installed with
//     c10::SetCPUAllocator before anything else), minus its count before the
//     model was built;
// and the peaks of one step and of build + setup, with the RSS high-water
// mark of each phase (VmHWM, reset through clear_refs).
#pragma once

#include "fsdp_model.hpp"

#include <loom/compat.hpp>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

namespace loom_bench {

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

// Installed first thing in main, before any tensor exists.
inline counting_allocator& install_counting_allocator() {
  static counting_allocator installed(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&installed, /*priority=*/100);
  return installed;
}

// The RSS high-water mark since the last reset (Linux: clear_refs 5).
inline void reset_rss_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }
inline std::int64_t rss_peak_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return -1;
}

inline double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

struct memory_probe {
  std::int64_t held_a = 0, held_b = 0;
  std::int64_t padding = 0;  // elements of padding in the flat buffers
  std::int64_t step_peak = 0, step_rss = 0, setup_peak = 0, setup_rss = 0;
};

// Builds WideMlp with fp32 Adam under fabric (a sharded strategy), takes
// three steps (Adam's state exists from the first), and measures.
template <class F>
memory_probe probe_memory(F& fabric, counting_allocator& counter, const at::Tensor& inputs, const at::Tensor& targets) {
  memory_probe out;
  fabric.barrier();
  const std::int64_t before = counter.live();
  counter.reset_peak();
  reset_rss_peak();
  at::manual_seed(0);
  WideMlp net;
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto [model, optimizer] = fabric.setup(net, adam);
  out.setup_peak = counter.peak() - before;
  out.setup_rss = rss_peak_bytes();
  auto step = [&] {
    optimizer.zero_grad();
    fabric.backward(torch::nn::functional::cross_entropy(model(inputs), targets));
    optimizer.step();
  };
  for (int s = 0; s < 3; ++s) step();
  out.held_b = counter.live() - before;
  std::set<const void*> seen;
  auto count = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) out.held_a += static_cast<std::int64_t>(t.storage().nbytes());
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
  for (const auto& unit : engine.units()) out.padding += unit.padded - unit.numel;
  counter.reset_peak();
  reset_rss_peak();
  step();
  out.step_peak = counter.peak() - before - out.held_b;
  out.step_rss = rss_peak_bytes();
  return out;
}

}  // namespace loom_bench
