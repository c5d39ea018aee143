// DeepSpeed's engine.backward and engine.step under loom::deepspeed, compiled
// once: the accumulation boundary, the loss scale (fp16), the fp32 masters
// (bf16, fp16), the config's clipping and the NVMe stream's step. The
// precision's own backward and optimizer step come in as calls.
#include "zero_model.hpp"

#include <loom/strategy/deepspeed.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <loom/strategy/gradient_norm.hpp>
#include <loom/strategy/zero_config.hpp>

#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <vector>

namespace loom {

void deepspeed::backward_with(const at::Tensor& loss, function_ref<void(const at::Tensor&)> precision_backward) {
  const std::int64_t k = config_->gradient_accumulation_steps;
  if ((k == 1 && !config_->fp16.enabled) || models_.empty()) {
    precision_backward(loss);
    return;
  }
  zero_model& model = *models_.front();
  auto run = [&](const at::Tensor& scaled) {
    if (config_->fp16.enabled) model.scaler.scale_loss(scaled).backward();
    else precision_backward(scaled);
  };
  if (k == 1) {
    run(loss);
    return;
  }
  const bool boundary = (model.micro_steps + 1) % k == 0;
  auto engine = model.engine.lock();
  engine->set_sync_enabled(boundary);
  try {
    run(loss / static_cast<double>(k));
  } catch (...) {
    engine->set_sync_enabled(true);
    throw;
  }
  engine->set_sync_enabled(true);
}

void deepspeed::step_with(torch::optim::Optimizer& optimizer, function_ref<void()> precision_step) {
  zero_model& model = model_of(optimizer);
  ++model.micro_steps;
  if (model.micro_steps % config_->gradient_accumulation_steps != 0) return;
  if (!model.masters.empty()) {
    step_masters(model, precision_step);
    return;
  }
  // bf16 with the masters on NVMe: the stream scales the fp32 gradients
  // by the clipping coefficient, as the in-memory masters' step does.
  if (model.nvme && config_->bf16) {
    std::vector<at::Tensor> gradients;
    for (auto& parameter : optimizer.param_groups().front().params()) {
      if (parameter.is_floating_point()) gradients.push_back(parameter.grad());
    }
    const double coefficient =
        config_->gradient_clipping > 0 ? clip_coefficient(gradients, config_->gradient_clipping) : 1.0;
    model.nvme->step(hyper_of(optimizer), coefficient);
    return;
  }
  if (config_->gradient_clipping > 0) {
    if (auto engine = model.engine.lock()) engine->clip_gradients(clip_options{.max_norm = config_->gradient_clipping});
  }
  // With the optimizer's state on NVMe its step is streamed (Adam's math, sub-group by sub-group).
  if (model.nvme) model.nvme->step(hyper_of(optimizer));
  else precision_step();
}

void deepspeed::step_masters(zero_model& model, function_ref<void()> precision_step) {
  at::NoGradGuard no_grad;
  torch::optim::Optimizer& optimizer = *model.optimizer;
  for (auto& m : model.masters) {
    m.low = m.param.detach();
    m.low_grad = m.param.grad();
    m.param.set_data(m.master);
    m.param.mutable_grad() = m.low_grad.defined() ? m.low_grad.to(at::kFloat) : at::Tensor();
  }
  auto restore = [&] {
    for (auto& m : model.masters) {
      m.param.set_data(m.low);
      m.param.mutable_grad() = m.low_grad;
      m.low = at::Tensor();
      m.low_grad = at::Tensor();
    }
  };
  try {
    if (config_->fp16.enabled) {
      // DeepSpeed: unscale, skip the step if any rank overflowed, clip, step, update the scale.
      const bool overflow = model.scaler.unscale_and_check(optimizer, &group());
      if (!overflow) {
        if (config_->gradient_clipping > 0) clip_masters(model, config_->gradient_clipping);
        optimizer.step();
      }
      model.scaler.update(overflow);
    } else {
      if (config_->gradient_clipping > 0) clip_masters(model, config_->gradient_clipping);
      precision_step();
    }
  } catch (...) {
    restore();
    throw;
  }
  for (auto& m : model.masters) m.low.copy_(m.master);
  restore();
}

void deepspeed::clip_masters(zero_model& model, double max_norm) {
  std::vector<at::Tensor> gradients;
  for (auto& m : model.masters) gradients.push_back(m.param.grad());
  detail::scale_gradients(gradients, clip_coefficient(gradients, max_norm));
}

double deepspeed::clip_coefficient(const std::vector<at::Tensor>& gradients, double max_norm) {
  const bool partitioned = config_->stage > 0 && world_size() > 1;
  detail::gradient_norm norm(2.0, partitioned ? group().device() : c10::Device(c10::DeviceType::CPU));
  for (const auto& gradient : gradients) norm.add(gradient);
  if (partitioned) norm.reduce_over(group());
  return detail::clip_coefficient(norm.value(), clip_options{.max_norm = max_norm});
}

}  // namespace loom
