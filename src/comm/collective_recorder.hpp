// What a rank has entered, collective by collective: the watchdog's memory.
// The hot path writes one slot of a fixed ring (an index taken with one
// atomic add, a dozen relaxed stores, one clock read): no allocation, no lock,
// nothing that waits. The watchdog thread reads the slots it needs through a
// sequence guard (a slot being rewritten reads as missing, never torn).
// Not installed.
#pragma once

#include <loom/comm/traffic.hpp>

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::comm {

// Adds one collective of `kind` and its payload to this process's traffic
// (loom/comm/traffic.hpp): relaxed atomic adds, nothing that waits. Returns
// true when communication timing is on and the collective now counts as in
// flight: the caller then calls collective_completed() exactly once, when
// its work completes (or fails, or was never started).
[[nodiscard]] bool note_traffic(collective_kind kind, std::uint64_t payload_bytes, int group_size) noexcept;
void collective_completed() noexcept;

// Ends a timed collective when it goes out of scope (a collective that
// completes before the caller returns: loom's synchronous emulations).
class timed_collective {
 public:
  explicit timed_collective(bool timed) noexcept : timed_(timed) {}
  timed_collective(const timed_collective&) = delete;
  timed_collective& operator=(const timed_collective&) = delete;
  ~timed_collective() {
    if (timed_) collective_completed();
  }

 private:
  bool timed_;
};

// The bytes of the tensors (a list's sum).
inline std::uint64_t bytes_of(const at::Tensor& tensor) noexcept {
  return tensor.defined() ? static_cast<std::uint64_t>(tensor.nbytes()) : 0;
}
inline std::uint64_t bytes_of(const std::vector<at::Tensor>& tensors) noexcept {
  std::uint64_t sum = 0;
  for (const auto& tensor : tensors) sum += bytes_of(tensor);
  return sum;
}
// The whole of what a group of `size` ranks gathers or scatters, from this
// rank's chunk: an all-gather's result, a reduce-scatter's input.
inline std::uint64_t all_chunks(std::uint64_t chunk_bytes, int size) noexcept {
  return chunk_bytes * static_cast<std::uint64_t>(size);
}

// One collective as the ranks compare it: kind, dtype and shape. Shapes are
// left out (rank == -1) where ranks legitimately differ (gather/scatter
// roots, all_to_all splits).
struct collective_entry {
  static constexpr int max_rank = 6;
  std::uint64_t sequence = 0;  // 0-based, per group, in the order this rank entered them
  collective_kind kind = collective_kind::barrier;
  std::int8_t dtype = -1;  // c10::ScalarType, -1: no tensor
  std::int8_t rank = -1;   // number of dimensions compared; -1: shape not compared
  std::array<std::int64_t, max_rank> shape{};
  std::int64_t entered_ns = 0;  // steady clock

  // "all_reduce(float[1024])"; "broadcast(long[2, 3])"; "barrier".
  std::string describe() const;
  // Same kind, dtype and (where compared) shape.
  bool matches(const collective_entry& other) const noexcept;
};

class collective_recorder {
 public:
  static constexpr std::size_t capacity = 256;  // a power of two

  // The recorder of a group of `group_size` ranks (0: not known).
  explicit collective_recorder(int group_size = 0) noexcept : group_size_(group_size) {}

  // Called on entry to every collective of the group, with its payload
  // (loom/comm/traffic.hpp says what that is for each kind).
  // A payload is required: record(kind, tensor, false) must not read as 0 bytes.
  // Returns note_traffic's answer: true obliges the caller to call
  // collective_completed() once the collective completes.
  void record(collective_kind kind, const at::Tensor* tensor, bool compare_shape) = delete;
  bool record(collective_kind kind, const at::Tensor* tensor, std::uint64_t payload_bytes,
              bool compare_shape = true) noexcept {
    const bool timed = note_traffic(kind, payload_bytes, group_size_);
    const std::uint64_t sequence = entered_.fetch_add(1, std::memory_order_relaxed);
    slot& s = ring_[sequence & (capacity - 1)];
    s.words[0].store(invalid, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    std::uint64_t header = static_cast<std::uint64_t>(kind);
    std::int64_t dims = -1;
    if (tensor != nullptr && tensor->defined()) {
      header |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(tensor->scalar_type())) << 8;
      if (compare_shape && tensor->dim() <= collective_entry::max_rank) {
        dims = tensor->dim();
        for (std::int64_t d = 0; d < dims; ++d) {
          s.words[3 + d].store(static_cast<std::uint64_t>(tensor->size(d)), std::memory_order_relaxed);
        }
      }
    } else {
      header |= std::uint64_t{0xff} << 8;
    }
    header |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(static_cast<std::int8_t>(dims))) << 16;
    s.words[1].store(header, std::memory_order_relaxed);
    s.words[2].store(static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()),
                     std::memory_order_relaxed);
    s.words[0].store(sequence, std::memory_order_release);
    return timed;
  }

  // Collectives entered so far.
  std::uint64_t entered() const noexcept { return entered_.load(std::memory_order_acquire); }

  // Entry `sequence`, if the ring still holds it whole.
  std::optional<collective_entry> at(std::uint64_t sequence) const noexcept;
  // The last `count` entries still held, oldest first.
  std::vector<collective_entry> recent(std::size_t count) const;

 private:
  static constexpr std::uint64_t invalid = ~std::uint64_t{0};
  // [0] sequence (the guard), [1] kind | dtype << 8 | rank << 16,
  // [2] entry time, [3..8] shape.
  struct alignas(64) slot {
    std::array<std::atomic<std::uint64_t>, 3 + collective_entry::max_rank> words{};
    slot() {
      for (auto& word : words) word.store(invalid, std::memory_order_relaxed);
    }
  };
  std::array<slot, capacity> ring_;
  std::atomic<std::uint64_t> entered_{0};
  int group_size_ = 0;
};

}  // namespace loom::comm
