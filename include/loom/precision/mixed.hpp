// The "-mixed" precisions: fp32 weights and optimizer, forward under autocast
// (Lightning's bf16-mixed and 16-mixed); 16-mixed scales the loss.
#pragma once

#include <loom/precision/autocast.hpp>
#include <loom/precision/convert.hpp>
#include <loom/precision/grad_scaler.hpp>
#include <loom/precision/precision_base.hpp>

#include <string_view>

namespace loom {

template <c10::ScalarType Dtype>
struct autocast_precision : precision_base {
  static constexpr bool is_mixed = true;
  static constexpr bool converts_io = true;
  static constexpr c10::ScalarType param_dtype = c10::ScalarType::Float;
  static constexpr c10::ScalarType compute_dtype = Dtype;

  // As Lightning's MixedPrecision: floating inputs enter in the autocast dtype
  // and outputs leave in the default dtype.
  at::Tensor convert_input(const at::Tensor& tensor) const { return convert_floating(tensor, Dtype); }
  at::Tensor convert_output(const at::Tensor& tensor) const {
    return convert_floating(tensor, c10::get_default_dtype_as_scalartype());
  }
  autocast_guard forward_context(c10::DeviceType device) const { return autocast_guard(device, Dtype); }
};

// bf16-mixed: no loss scaling (bf16 has fp32's exponent range).
struct bf16_mixed : autocast_precision<c10::ScalarType::BFloat16> {
  static constexpr std::string_view name = "bf16-mixed";
};

// 16-mixed: autocast to fp16 and a grad_scaler; the scaler's state goes into
// checkpoints under the key "precision". Not on cpu with LibTorch 1.13.
struct fp16_mixed : autocast_precision<c10::ScalarType::Half> {
  static constexpr std::string_view name = "16-mixed";
  static constexpr bool has_state = true;

  fp16_mixed() = default;
  explicit fp16_mixed(grad_scaler_options options) : scaler_(options) {}

  void backward(const at::Tensor& loss) { scaler_.scale(loss).backward(); }
  // Skips the step when a gradient is inf or nan, then adapts the scale.
  void optimizer_step(torch::optim::Optimizer& optimizer, optimizer_slot slot) {
    scaler_.step(optimizer, slot);
    scaler_.update();
  }
  void unscale_gradients(torch::optim::Optimizer& optimizer, optimizer_slot slot) { scaler_.unscale_(optimizer, slot); }

  c10::IValue state_dict() const { return scaler_.state_dict(); }
  void load_state_dict(const c10::IValue& state) { scaler_.load_state_dict(state); }

  grad_scaler& scaler() noexcept { return scaler_; }
  const grad_scaler& scaler() const noexcept { return scaler_; }

 private:
  grad_scaler scaler_;
};

}  // namespace loom
