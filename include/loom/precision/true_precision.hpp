// The "-true" precisions: weights, inputs and compute in one dtype (Lightning's
// 32-true, 64-true, 16-true, bf16-true). Outputs return in the default dtype.
#pragma once

#include <loom/precision/autocast.hpp>
#include <loom/precision/convert.hpp>
#include <loom/precision/precision_base.hpp>

#include <string_view>

namespace loom {

// 32-true: LibTorch's default, so every conversion is skipped at compile time.
struct fp32 : precision_base {
  static constexpr std::string_view name = "32-true";
  static constexpr c10::ScalarType param_dtype = c10::ScalarType::Float;
  static constexpr c10::ScalarType compute_dtype = c10::ScalarType::Float;
};

template <c10::ScalarType Dtype>
struct true_precision : precision_base {
  static constexpr c10::ScalarType param_dtype = Dtype;
  static constexpr c10::ScalarType compute_dtype = Dtype;
  static constexpr bool converts_io = true;

  void convert_module(torch::nn::Module& module) { convert_module_floating(module, Dtype); }
  at::Tensor convert_input(const at::Tensor& tensor) const { return convert_floating(tensor, Dtype); }
  at::Tensor convert_output(const at::Tensor& tensor) const {
    return convert_floating(tensor, c10::get_default_dtype_as_scalartype());
  }
  // Factory calls inside forward (torch::zeros, ...) make Dtype tensors too.
  default_dtype_guard forward_context(c10::DeviceType /*device*/) const { return default_dtype_guard(Dtype); }
  default_dtype_guard init_context() const { return default_dtype_guard(Dtype); }
};

// 64-true
struct fp64 : true_precision<c10::ScalarType::Double> {
  static constexpr std::string_view name = "64-true";
};

// 16-true. Not on cpu with LibTorch 1.13 (no fp16 matmul kernels there).
struct fp16 : true_precision<c10::ScalarType::Half> {
  static constexpr std::string_view name = "16-true";
};

// bf16-true
struct bf16 : true_precision<c10::ScalarType::BFloat16> {
  static constexpr std::string_view name = "bf16-true";
};

}  // namespace loom
