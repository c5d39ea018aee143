// LibTorch 1.13 (Debian) vs 2.x (official downloads): the one place where
// version #ifs live. Everything else in loom calls these wrappers.
#pragma once

#include <loom/errors.hpp>

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/optim/optimizer.h>
#include <c10/util/string_utils.h>
#include <torch/version.h>

#include <string>

#define LOOM_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||               \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// fp16 matmul and fp16 autocast on CPU: absent in 1.13 (the kernels are
// missing and autocast refuses the dtype). Kept off on every version until it
// is measured on a 2.x build; the cpu x fp16 compile errors key off it.
#define LOOM_CPU_HAS_FP16_KERNELS 0

// c10::Allocator::allocate lost its const, and copy_data became a pure
// virtual, in torch 2.3: a counting allocator (bench/fsdp_memory) spells
// both through these.
#if LOOM_TORCH_VERSION_AT_LEAST(2, 3)
#define LOOM_ALLOCATOR_ALLOCATE_CONST
#define LOOM_ALLOCATOR_NEEDS_COPY_DATA 1
#else
#define LOOM_ALLOCATOR_ALLOCATE_CONST const
#define LOOM_ALLOCATOR_NEEDS_COPY_DATA 0
#endif

namespace loom::compat {

// torch 2.4 replaced the per-backend autocast setters with device-type ones.
// Before it, each device that had autocast had its own pair (CPU, CUDA, XPU);
// any other device had none, and is refused by name rather than handed the
// CUDA state (which would switch CUDA's autocast from another device's guard).
#if !LOOM_TORCH_VERSION_AT_LEAST(2, 4)
namespace detail {
struct autocast_setters {
  bool (*enabled)();
  void (*set_enabled)(bool);
  c10::ScalarType (*dtype)();
  void (*set_dtype)(c10::ScalarType);
};
inline autocast_setters autocast_setters_of(c10::DeviceType device) {
  switch (device) {
    case c10::DeviceType::CPU:
      return {&at::autocast::is_cpu_enabled, &at::autocast::set_cpu_enabled, &at::autocast::get_autocast_cpu_dtype,
              &at::autocast::set_autocast_cpu_dtype};
    case c10::DeviceType::CUDA:
      return {&at::autocast::is_enabled, &at::autocast::set_enabled, &at::autocast::get_autocast_gpu_dtype,
              &at::autocast::set_autocast_gpu_dtype};
    case c10::DeviceType::XPU:
      return {&at::autocast::is_xpu_enabled, &at::autocast::set_xpu_enabled, &at::autocast::get_autocast_xpu_dtype,
              &at::autocast::set_autocast_xpu_dtype};
    default:
      throw configuration_error("autocast on device type " + c10::DeviceTypeName(device) +
                                ": LibTorch " TORCH_VERSION " has autocast for CPU, CUDA and XPU only "
                                "(LibTorch 2.4 and later: every device type with autocast kernels)");
  }
}
}  // namespace detail
#endif

inline bool autocast_enabled(c10::DeviceType device) {
#if LOOM_TORCH_VERSION_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return detail::autocast_setters_of(device).enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if LOOM_TORCH_VERSION_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
#else
  detail::autocast_setters_of(device).set_enabled(enabled);
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if LOOM_TORCH_VERSION_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return detail::autocast_setters_of(device).dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if LOOM_TORCH_VERSION_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  detail::autocast_setters_of(device).set_dtype(dtype);
#endif
}

// What Optimizer::zero_grad() does when not told: zero in place on 1.13, set
// to none on 2.x.
inline constexpr bool zero_grad_sets_to_none = LOOM_TORCH_VERSION_AT_LEAST(2, 0);

// Optimizer::zero_grad's two behaviours, the same on every version: LibTorch's
// own calls detach_() on each gradient (1.13 always, 2.x whenever it is
// defined), which a gradient that is a view of a DDP bucket refuses; here
// the gradient is zeroed in place, or dropped.
inline void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      auto& grad = param.mutable_grad();
      if (!grad.defined()) continue;
      if (set_to_none) {
        grad.reset();
        continue;
      }
      at::NoGradGuard no_grad;
      if (grad.grad_fn()) grad = grad.detach();
      grad.zero_();
    }
  }
}

// The key of a parameter in Optimizer::state(): a string of the TensorImpl
// address in 1.13, the address itself in 2.x.
inline auto optimizer_state_key(const at::Tensor& parameter) {
#if LOOM_TORCH_VERSION_AT_LEAST(2, 0)
  return static_cast<void*>(parameter.unsafeGetTensorImpl());
#else
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
#endif
}

}  // namespace loom::compat
