// A placeholder parameter: its shape over one element (expanded, no storage
// of its size). Sharded construction leaves one for each parameter of a unit
// whose shard it keeps (strategy/unit_construction.hpp); tensor-parallel
// slicing keeps a placeholder of the slice's shape instead of copying one.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

namespace loom::detail {

inline bool is_placeholder(const at::Tensor& tensor) noexcept {
  return tensor.defined() && tensor.numel() > 1 && tensor.has_storage() &&
         tensor.storage().nbytes() < static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
}

}  // namespace loom::detail
