// loom::counting_allocator: the live bytes of every CPU tensor allocation and
// their peak, for measuring what a strategy keeps per rank (loom-bench,
// bench/fsdp_memory, bench/zero_memory). install_counting_allocator() puts
// it in front of c10's CPU allocator; call it first thing in main, before
// any tensor exists (a tensor allocated earlier is freed by its own deleter
// and never counted). Each allocation takes a lock and a table entry: a
// measuring tool, not for production runs.
#pragma once

#include <loom/compat.hpp>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace loom {

// Counts the live bytes of every CPU tensor allocation, and their peak. The
// DataPtr's context is the data pointer itself (c10's raw_allocate, which
// bf16 kernels use, asserts it), so each allocation is found in a table.
class counting_allocator final : public c10::Allocator {
 public:
  explicit counting_allocator(c10::Allocator* inner) : inner_(inner) { self_ = this; }
  c10::DataPtr allocate(size_t bytes) LOOM_ALLOCATOR_ALLOCATE_CONST override {
    c10::DataPtr inner = inner_->allocate(bytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    const auto now = live_.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
    auto peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      records_.emplace(data, record{std::move(inner), bytes});
    }
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
#if LOOM_ALLOCATOR_NEEDS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#endif
  std::int64_t live() const { return live_.load(); }
  std::int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }

 private:
  struct record {
    c10::DataPtr inner;
    size_t bytes;
  };
  static void release(void* data) {
    if (data == nullptr) return;
    counting_allocator& self = *self_;
    record gone;
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto found = self.records_.find(data);
      if (found == self.records_.end()) return;
      gone = std::move(found->second);
      self.records_.erase(found);
    }
    self.live_.fetch_sub(static_cast<std::int64_t>(gone.bytes));
  }
  static inline counting_allocator* self_ = nullptr;
  c10::Allocator* inner_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, record> records_;
  mutable std::atomic<std::int64_t> live_{0};
  mutable std::atomic<std::int64_t> peak_{0};
};

// Installed once; first thing in main, before any tensor exists.
inline counting_allocator& install_counting_allocator() {
  static counting_allocator installed(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&installed, /*priority=*/100);
  return installed;
}

}  // namespace loom
