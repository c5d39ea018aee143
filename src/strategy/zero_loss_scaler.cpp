#include <loom/errors.hpp>
#include <loom/strategy/zero_loss_scaler.hpp>
#include <loom/util/unscale_gradients.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>

namespace loom {

zero_loss_scaler::zero_loss_scaler(const zero_loss_scaling& config)
    : dynamic_(config.loss_scale <= 0),
      scale_(config.loss_scale > 0 ? config.loss_scale : std::ldexp(1.0, static_cast<int>(config.initial_scale_power))),
      min_scale_(config.min_loss_scale),
      window_(config.loss_scale_window),
      hysteresis_(config.hysteresis),
      hysteresis_left_(config.hysteresis) {}

at::Tensor zero_loss_scaler::scale_loss(const at::Tensor& loss) const { return loss * scale_; }

void zero_loss_scaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (hysteresis_ == 1 || hysteresis_left_ == 1) {
      scale_ = std::max(scale_ / 2.0, min_scale_);
    } else {
      --hysteresis_left_;
    }
    last_overflow_ = iteration_;
  } else if ((iteration_ - last_overflow_) % window_ == 0) {
    hysteresis_left_ = hysteresis_;  // DeepSpeed (consecutive_hysteresis off): restored when the scale grows
    scale_ *= 2.0;
  }
  ++iteration_;
}

bool zero_loss_scaler::unscale_and_check(torch::optim::Optimizer& optimizer, comm::process_group* group) {
  at::NoGradGuard no_grad;
  const bool reduce = group != nullptr && group->valid();
  // On the group's device: what NCCL reduces.
  at::Tensor found = at::zeros(
      {1}, at::TensorOptions().dtype(at::kFloat).device(reduce ? group->device() : c10::Device(c10::DeviceType::CPU)));
  std::vector<at::Tensor> gradients;
  for (auto& param_group : optimizer.param_groups()) {
    for (auto& p : param_group.params()) {
      if (p.grad().defined()) gradients.push_back(p.mutable_grad());
    }
  }
  const c10::Device where = gradients.empty() ? c10::Device(c10::DeviceType::CPU) : gradients.front().device();
  detail::unscale_and_find_nonfinite(gradients, found,
                                     at::full({1}, 1.0 / scale_, at::TensorOptions().dtype(at::kFloat).device(where)));
  if (reduce) group->all_reduce(found, reduce_op::max);
  return found.item<float>() > 0;
}

bool zero_loss_scaler::step(torch::optim::Optimizer& optimizer, comm::process_group* group) {
  const bool overflow = unscale_and_check(optimizer, group);
  if (!overflow) optimizer.step();
  update(overflow);
  return !overflow;
}

c10::IValue zero_loss_scaler::state_dict() const {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("cur_scale", scale_);
  out.insert("cur_iter", iteration_);
  out.insert("last_overflow_iter", last_overflow_);
  out.insert("cur_hysteresis", hysteresis_left_);
  return out;
}

void zero_loss_scaler::load_state_dict(const c10::IValue& state) {
  if (!state.isGenericDict()) throw checkpoint_error("the ZeRO loss scaler's state is not a dict");
  const auto dict = state.toGenericDict();
  for (const char* key : {"cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"}) {
    if (!dict.contains(key)) throw checkpoint_error(std::string("the ZeRO loss scaler's state has no '") + key + "'");
  }
  if (!dict.at("cur_scale").isDouble() || !dict.at("cur_iter").isInt() || !dict.at("last_overflow_iter").isInt() ||
      !dict.at("cur_hysteresis").isInt()) {
    throw checkpoint_error("the ZeRO loss scaler's state has values of the wrong type (cur_scale: float; cur_iter, "
                           "last_overflow_iter, cur_hysteresis: int)");
  }
  scale_ = dict.at("cur_scale").toDouble();
  iteration_ = dict.at("cur_iter").toInt();
  last_overflow_ = dict.at("last_overflow_iter").toInt();
  hysteresis_left_ = dict.at("cur_hysteresis").toInt();
}

}  // namespace loom
