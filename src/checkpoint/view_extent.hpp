// How far into its storage a strided view reaches: one rule for loom's walk
// of the pickle (before LibTorch builds a tensor) and for the check of what
// it built. Internal to src/checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::detail {

// The element one past the last the view reaches (0 for an empty view), or
// -1 when the offset, a size or a stride is negative or the sum does not fit.
inline std::int64_t view_extent(std::int64_t offset, const std::int64_t* sizes, const std::int64_t* strides,
                                std::size_t dims) {
  std::int64_t last = offset;
  if (last < 0) return -1;
  for (std::size_t d = 0; d < dims; ++d) {
    if (sizes[d] < 0 || strides[d] < 0) return -1;
    if (sizes[d] == 0) return 0;
  }
  for (std::size_t d = 0; d < dims; ++d) {
    std::int64_t step = 0;
    if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &step) || __builtin_add_overflow(last, step, &last)) return -1;
  }
  return last + 1;
}

}  // namespace loom::detail
