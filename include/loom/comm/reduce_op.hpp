// The reduction operators of loom's collectives (no torch headers).
#pragma once

#include <string_view>

namespace loom {

enum class reduce_op { sum, mean, min, max, product };

constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::mean: return "mean";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::product: return "product";
  }
  return "?";
}

}  // namespace loom
