#include <loom/errors.hpp>
#include <loom/precision/grad_scaler.hpp>
#include <loom/util/unscale_gradients.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <string>

namespace loom {

grad_scaler::grad_scaler(grad_scaler_options options) : options_(options) {
  if (!(options_.init_scale > 0.0)) throw configuration_error("grad_scaler: init_scale must be > 0");
  if (!(options_.growth_factor > 1.0)) throw configuration_error("grad_scaler: growth_factor must be > 1.0");
  if (!(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0)) {
    throw configuration_error("grad_scaler: backoff_factor must be in (0, 1)");
  }
  if (options_.growth_interval <= 0) throw configuration_error("grad_scaler: growth_interval must be a positive integer");
}

void grad_scaler::lazy_init(const c10::Device& device) {
  if (scale_.defined()) {
    if (scale_.device() != device) {
      scale_ = scale_.to(device);
      growth_tracker_ = growth_tracker_.to(device);
    }
    return;
  }
  scale_ = at::full({1}, options_.init_scale, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
}

grad_scaler::optimizer_state& grad_scaler::state_for(optimizer_slot slot) {
  if (slot.index >= static_cast<int>(optimizers_.size())) optimizers_.resize(static_cast<std::size_t>(slot.index) + 1);
  return optimizers_[static_cast<std::size_t>(slot.index)];
}

at::Tensor grad_scaler::scale(const at::Tensor& loss) {
  if (!options_.enabled) return loss;
  lazy_init(loss.device());
  return loss * scale_;
}

void grad_scaler::unscale_(torch::optim::Optimizer& optimizer, optimizer_slot slot) {
  if (!options_.enabled) return;
  auto& state = state_for(slot);
  if (state.current == stage::unscaled) {
    throw std::logic_error("grad_scaler::unscale_() has already been called on this optimizer since the last update().");
  }
  if (state.current == stage::stepped) throw std::logic_error("grad_scaler::unscale_() is being called after step().");
  if (!scale_.defined()) {
    throw std::logic_error("grad_scaler: unscale_() before any scale(): call fabric.backward(loss) first.");
  }

  at::NoGradGuard no_grad;
  // As torch: the reciprocal in double, then float, so 1/65536 is exact.
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  at::Tensor found_inf = at::zeros({1}, scale_.options());
  std::vector<at::Tensor> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      const auto& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.scalar_type() == at::kHalf && param.scalar_type() == at::kHalf) {
        throw std::logic_error(
            "grad_scaler: attempting to unscale fp16 gradients of fp16 parameters. fp16_mixed keeps the weights "
            "in fp32; for fp16 weights use loom::fp16 (16-true), which does not scale the loss.");
      }
      grads.push_back(grad);
    }
  }
  detail::unscale_and_find_nonfinite(grads, found_inf, inv_scale);
  state.found_inf = found_inf;
  state.current = stage::unscaled;
}

bool grad_scaler::step(torch::optim::Optimizer& optimizer, optimizer_slot slot) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  auto& state = state_for(slot);
  if (state.current == stage::stepped) {
    throw std::logic_error("grad_scaler::step() has already been called since the last update().");
  }
  if (state.current == stage::ready) unscale_(optimizer, slot);
  const bool finite = state.found_inf.item<float>() == 0.0F;
  if (finite) optimizer.step();
  state.current = stage::stepped;
  return finite;
}

void grad_scaler::update() {
  if (!options_.enabled) return;
  at::Tensor found_inf_combined;
  for (auto& state : optimizers_) {
    if (state.current == stage::ready || !state.found_inf.defined()) continue;
    found_inf_combined = found_inf_combined.defined() ? found_inf_combined + state.found_inf : state.found_inf;
  }
  if (!found_inf_combined.defined()) {
    throw std::logic_error("grad_scaler::update(): no inf checks were recorded; call step() before update().");
  }
  if (scale_.is_cuda()) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_combined, options_.growth_factor,
                           options_.backoff_factor, options_.growth_interval);
  } else {
    // The same rule as _amp_update_scale_, on ordinary CPU ops.
    if (found_inf_combined.item<float>() > 0.0F) {
      scale_.mul_(options_.backoff_factor);
      growth_tracker_.zero_();
    } else {
      const auto successful = growth_tracker_.item<int>() + 1;
      if (successful == options_.growth_interval) {
        const float grown = scale_.item<float>() * static_cast<float>(options_.growth_factor);
        // Do not grow into inf: keep the old scale, as torch does.
        if (std::isfinite(grown)) scale_.fill_(grown);
        growth_tracker_.zero_();
      } else {
        growth_tracker_.fill_(successful);
      }
    }
  }
  for (auto& state : optimizers_) state = optimizer_state{};
}

double grad_scaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : options_.init_scale;
}

std::int64_t grad_scaler::growth_tracker() const {
  return growth_tracker_.defined() ? growth_tracker_.item<int>() : 0;
}

c10::IValue grad_scaler::state_dict() const {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  if (!options_.enabled) return dict;
  dict.insert("scale", get_scale());
  dict.insert("growth_factor", options_.growth_factor);
  dict.insert("backoff_factor", options_.backoff_factor);
  dict.insert("growth_interval", options_.growth_interval);
  dict.insert("_growth_tracker", growth_tracker());
  return dict;
}

void grad_scaler::load_state_dict(const c10::IValue& state) {
  if (!options_.enabled) return;
  if (!state.isGenericDict()) throw checkpoint_error("grad_scaler state must be a dict, got " + state.tagKind());
  const auto dict = state.toGenericDict();
  if (dict.empty()) {
    throw checkpoint_error(
        "grad_scaler state is empty, possibly because it was saved from a disabled scaler (bf16 or 32-true).");
  }
  auto number = [&](const char* key) -> double {
    auto it = dict.find(key);
    if (it == dict.end()) throw checkpoint_error(std::string("grad_scaler state has no '") + key + "'");
    const auto& value = it->value();
    if (value.isDouble()) return value.toDouble();
    if (value.isInt()) return static_cast<double>(value.toInt());
    throw checkpoint_error(std::string("grad_scaler state '") + key + "' is not a number");
  };
  grad_scaler_options loaded = options_;
  const double scale = number("scale");
  loaded.growth_factor = number("growth_factor");
  loaded.backoff_factor = number("backoff_factor");
  loaded.growth_interval = static_cast<std::int64_t>(number("growth_interval"));
  const auto tracker = static_cast<int>(number("_growth_tracker"));
  if (!(scale > 0.0) || !std::isfinite(scale)) throw checkpoint_error("grad_scaler state has a scale that is not positive and finite");

  options_ = loaded;
  const auto device = scale_.defined() ? scale_.device() : c10::Device(c10::DeviceType::CPU);
  scale_ = at::full({1}, scale, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::full({1}, tracker, at::TensorOptions().dtype(at::kInt).device(device));
}

}  // namespace loom
