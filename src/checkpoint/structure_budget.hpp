// What loom may allocate to check a checkpoint file's structure (its zip
// directory and its pickle) before it trusts any of it: one fixed budget,
// whatever the file's size, counted at every allocation the checks make.
// A forged file whose structure would need more (entries by the million,
// values pending by the million, a memo indexed to the end of the pickle)
// is refused when it reaches the budget, not after it has exhausted memory;
// an honest checkpoint's structure is small, its data lives in tensor
// records. Internal to src/checkpoint.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

namespace loom::detail {

// 64 MiB: about 90,000 tensors in one file (727 bytes each for a LibTorch
// archive: docs/checkpoints.md, "Bounded allocation on load", and the test
// that prints it); a sharded checkpoint spreads its tensors over one file
// per rank.
inline constexpr std::size_t checkpoint_structure_budget = std::size_t{64} << 20;

class structure_budget {
 public:
  explicit structure_budget(std::size_t limit = checkpoint_structure_budget) : limit_(limit) {}
  structure_budget(const structure_budget&) = delete;
  structure_budget& operator=(const structure_budget&) = delete;

  // Throws std::runtime_error (naming the budget) rather than pass it.
  void take(std::size_t bytes) {
    if (bytes > limit_ - held_) {
      const std::string amount = limit_ % (std::size_t{1} << 20) == 0 ? std::to_string(limit_ >> 20) + " MiB"
                                                                       : std::to_string(limit_ >> 10) + " KiB";
      throw std::runtime_error("its structure (zip directory and pickle) needs more than " + amount +
                              " to check, the most loom spends on a file's structure whatever its size: a "
                              "forged file, or one file holding very many tensors (about 90,000 fit in 64 MiB; save "
                              "such a model sharded)");
    }
    held_ += bytes;
    if (held_ > peak_) peak_ = held_;
  }
  void give(std::size_t bytes) noexcept { held_ -= bytes; }
  std::size_t held() const noexcept { return held_; }
  std::size_t peak() const noexcept { return peak_; }

 private:
  std::size_t limit_;
  std::size_t held_ = 0;
  std::size_t peak_ = 0;
};

// A standard allocator that charges a structure_budget: the containers of
// the zip index and of the pickle walk use it, so what they hold, vector
// growth and map nodes included, is what the budget counts.
template <class T>
class budget_allocator {
 public:
  using value_type = T;
  explicit budget_allocator(structure_budget& budget) noexcept : budget_(&budget) {}
  template <class U>
  budget_allocator(const budget_allocator<U>& other) noexcept : budget_(other.budget()) {}

  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    budget_->take(n * sizeof(T));
    try {
      return std::allocator<T>{}.allocate(n);
    } catch (...) {
      budget_->give(n * sizeof(T));
      throw;
    }
  }
  void deallocate(T* p, std::size_t n) noexcept {
    std::allocator<T>{}.deallocate(p, n);
    budget_->give(n * sizeof(T));
  }
  structure_budget* budget() const noexcept { return budget_; }

  friend bool operator==(const budget_allocator& a, const budget_allocator& b) noexcept { return a.budget_ == b.budget_; }

 private:
  structure_budget* budget_;
};

}  // namespace loom::detail
