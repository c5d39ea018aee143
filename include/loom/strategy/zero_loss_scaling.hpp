// DeepSpeed's fp16 section as loom reads it: what zero_loss_scaler.hpp runs
// and zero_config.hpp resolves (apart from both, so the scaler needs no
// configuration reader). Torch-free.
#pragma once

#include <cstdint>

namespace loom {

// DeepSpeed's fp16 section: its dynamic loss scaler (loss_scale > 0: static).
struct zero_loss_scaling {
  bool enabled = false;
  double loss_scale = 0;
  std::int64_t initial_scale_power = 16;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  double min_loss_scale = 1;
};

}  // namespace loom
