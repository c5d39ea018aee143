// Lightning's clip_gradients arguments: exactly one of clip_val and max_norm.
#pragma once

#include <optional>

namespace loom {

struct clip_options {
  std::optional<double> clip_val;
  std::optional<double> max_norm;
  double norm_type = 2.0;
  bool error_if_nonfinite = true;
};

}  // namespace loom
