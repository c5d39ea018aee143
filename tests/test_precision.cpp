// 16-mixed's GradScaler on its CPU path (LibTorch's _amp_* kernels are
// CUDA-only), driven with injected inf/nan gradients; autocast guards.
#include "test_models.hpp"

#include "catch.hpp"
#include <loom/loom.hpp>
#include <torch/optim/sgd.h>

#include <limits>

namespace {

struct tiny {
  at::Tensor weight = at::full({3}, 1.0).requires_grad_(true);
  torch::optim::SGD optimizer{std::vector<at::Tensor>{weight}, torch::optim::SGDOptions(0.1)};

  // d(loss)/d(weight) = [1, 2, 3]
  at::Tensor loss() const { return (weight * at::tensor({1.0F, 2.0F, 3.0F})).sum(); }
};

}  // namespace

TEST_CASE("grad_scaler scales the loss and unscales gradients exactly", "[precision][scaler]") {
  loom::grad_scaler scaler({.init_scale = 1024.0});
  tiny t;
  auto scaled = scaler.scale(t.loss());
  CHECK(scaled.item<float>() == Approx(6.0 * 1024));
  scaled.backward();
  CHECK(torch::equal(t.weight.grad(), at::tensor({1024.0F, 2048.0F, 3072.0F})));
  scaler.unscale_(t.optimizer, {0});
  CHECK(torch::equal(t.weight.grad(), at::tensor({1.0F, 2.0F, 3.0F})));
  CHECK_THROWS_WITH(scaler.unscale_(t.optimizer, {0}), Catch::Contains("already been called"));
  CHECK(scaler.step(t.optimizer, {0}));
  CHECK(torch::allclose(t.weight, at::tensor({0.9F, 0.8F, 0.7F})));
  CHECK_THROWS_WITH(scaler.step(t.optimizer, {0}), Catch::Contains("already been called"));
  scaler.update();
  CHECK(scaler.get_scale() == 1024.0);
  CHECK(scaler.growth_tracker() == 1);
}

TEST_CASE("grad_scaler skips the step on inf or nan and backs off the scale", "[precision][scaler]") {
  const float poison = GENERATE(std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN());
  loom::grad_scaler scaler({.init_scale = 256.0, .backoff_factor = 0.25});
  tiny t;
  scaler.scale(t.loss()).backward();
  t.weight.mutable_grad()[1] = poison;
  const auto before = t.weight.detach().clone();
  CHECK_FALSE(scaler.step(t.optimizer, {0}));
  CHECK(torch::equal(t.weight.detach(), before));  // untouched
  scaler.update();
  CHECK(scaler.get_scale() == 64.0);
  CHECK(scaler.growth_tracker() == 0);
}

TEST_CASE("grad_scaler grows the scale after growth_interval finite steps", "[precision][scaler]") {
  loom::grad_scaler scaler({.init_scale = 8.0, .growth_factor = 2.0, .growth_interval = 3});
  tiny t;
  std::vector<double> scales;
  for (int step = 0; step < 7; ++step) {
    t.optimizer.zero_grad();
    scaler.scale(t.loss()).backward();
    if (step == 4) t.weight.mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
    scaler.step(t.optimizer, {0});
    scaler.update();
    scales.push_back(scaler.get_scale());
  }
  // 3 finite steps: x2; step 3 finite; step 4 nan: x0.5 and reset; then 2 finite.
  CHECK((scales == std::vector<double>{8, 8, 16, 16, 8, 8, 8}));
}

TEST_CASE("grad_scaler state round-trips and is validated before it changes anything", "[precision][scaler]") {
  loom::grad_scaler scaler({.init_scale = 32.0, .growth_interval = 5});
  tiny t;
  scaler.scale(t.loss()).backward();
  scaler.step(t.optimizer, {0});
  scaler.update();
  const auto saved = scaler.state_dict();
  const auto dict = saved.toGenericDict();
  CHECK(dict.at("scale").toDouble() == 32.0);
  CHECK(dict.at("_growth_tracker").toInt() == 1);
  CHECK(dict.at("growth_interval").toInt() == 5);

  loom::grad_scaler restored;
  restored.load_state_dict(saved);
  CHECK(restored.get_scale() == 32.0);
  CHECK(restored.growth_tracker() == 1);
  CHECK(restored.options().growth_interval == 5);

  c10::impl::GenericDict broken(c10::StringType::get(), c10::AnyType::get());
  broken.insert("scale", 2.0);
  CHECK_THROWS_WITH(restored.load_state_dict(broken), Catch::Contains("has no 'growth_factor'"));
  CHECK(restored.get_scale() == 32.0);
  c10::impl::GenericDict empty(c10::StringType::get(), c10::AnyType::get());
  CHECK_THROWS_WITH(restored.load_state_dict(empty), Catch::Contains("disabled scaler"));
}

TEST_CASE("fp16_mixed scales backward, unscales for clipping and skips non-finite steps", "[precision][scaler]") {
  // The precision object runs on CPU tensors even though Fabric<cpu, *, fp16_mixed>
  // does not compile: LibTorch 1.13 has no fp16 autocast on CPU.
  loom::fp16_mixed precision(loom::grad_scaler_options{.init_scale = 128.0});
  tiny t;
  precision.backward(t.loss());
  CHECK(torch::equal(t.weight.grad(), at::tensor({128.0F, 256.0F, 384.0F})));
  precision.unscale_gradients(t.optimizer, {0});
  CHECK(torch::equal(t.weight.grad(), at::tensor({1.0F, 2.0F, 3.0F})));
  precision.optimizer_step(t.optimizer, {0});  // no second unscale: the step sees the true gradients
  CHECK(torch::allclose(t.weight, at::tensor({0.9F, 0.8F, 0.7F})));

  t.optimizer.zero_grad();
  precision.backward(t.loss());
  t.weight.mutable_grad()[2] = std::numeric_limits<float>::infinity();
  const auto before = t.weight.detach().clone();
  precision.optimizer_step(t.optimizer, {0});
  CHECK(torch::equal(t.weight.detach(), before));
  CHECK(precision.scaler().get_scale() == 64.0);
  CHECK(loom::has_precision_state<loom::fp16_mixed>);
  CHECK_FALSE(loom::has_precision_state<loom::bf16_mixed>);
}

TEST_CASE("autocast_guard nests, restores and clears the cast cache", "[precision]") {
  using loom::compat::autocast_enabled;
  REQUIRE_FALSE(autocast_enabled(c10::DeviceType::CPU));
  {
    loom::autocast_guard outer(c10::DeviceType::CPU, at::kBFloat16);
    CHECK(autocast_enabled(c10::DeviceType::CPU));
    CHECK(at::matmul(at::ones({2, 2}), at::ones({2, 2})).scalar_type() == at::kBFloat16);
    {
      loom::autocast_guard inner(c10::DeviceType::CPU, at::kBFloat16, /*enabled=*/false);
      CHECK_FALSE(autocast_enabled(c10::DeviceType::CPU));
      CHECK(at::matmul(at::ones({2, 2}), at::ones({2, 2})).scalar_type() == at::kFloat);
    }
    CHECK(autocast_enabled(c10::DeviceType::CPU));
  }
  CHECK_FALSE(autocast_enabled(c10::DeviceType::CPU));
}

TEST_CASE("compat's autocast state is each device type's own; a type without autocast is refused by name",
          "[precision]") {
  using namespace loom::compat;
  const auto cuda_dtype = autocast_dtype(c10::DeviceType::CUDA);
  const auto xpu_dtype = autocast_dtype(c10::DeviceType::XPU);
  // A dtype neither device has now (XPU's default is bf16, CUDA's fp16), so
  // setting XPU's shows whether CUDA's moved with it.
  c10::ScalarType other = at::kFloat;
  for (const auto candidate : {at::kBFloat16, at::kHalf, at::kFloat}) {
    if (candidate != cuda_dtype && candidate != xpu_dtype) {
      other = candidate;
      break;
    }
  }
  set_autocast_dtype(c10::DeviceType::XPU, other);
  CHECK(autocast_dtype(c10::DeviceType::XPU) == other);
  CHECK(autocast_dtype(c10::DeviceType::CUDA) == cuda_dtype);  // 1.13 used to set CUDA's for any non-CPU type
  set_autocast_enabled(c10::DeviceType::XPU, true);
  CHECK(autocast_enabled(c10::DeviceType::XPU));
  CHECK_FALSE(autocast_enabled(c10::DeviceType::CUDA));
  set_autocast_enabled(c10::DeviceType::XPU, false);
  set_autocast_dtype(c10::DeviceType::XPU, xpu_dtype);
#if !LOOM_TORCH_VERSION_AT_LEAST(2, 4)
  CHECK_THROWS_AS(set_autocast_enabled(c10::DeviceType::HIP, true), loom::configuration_error);
  CHECK_THROWS_WITH(autocast_dtype(c10::DeviceType::HIP),
                    Catch::Contains("device type HIP") && Catch::Contains("CPU, CUDA and XPU only"));
  CHECK_FALSE(autocast_enabled(c10::DeviceType::CUDA));
#endif
}

TEST_CASE("ZeRO's loss scaler follows DeepSpeed's DynamicLossScaler: hysteresis, window, floor, static",
          "[precision][scaler][zero]") {
  loom::zero_loss_scaler scaler({.enabled = true, .initial_scale_power = 4, .loss_scale_window = 3, .hysteresis = 2,
                                 .min_loss_scale = 4});
  CHECK(scaler.scale() == 16.0);
  std::vector<double> scales;
  // clean, clean, clean (x2 after 3), overflow (hysteresis 2 -> 1, scale kept), overflow (halved),
  // overflow (halved), overflow (floor 4), clean x3 (x2)
  for (bool overflow : {false, false, false, true, true, true, true, false, false, false}) {
    scaler.update(overflow);
    scales.push_back(scaler.scale());
  }
  CHECK((scales == std::vector<double>{16, 16, 32, 32, 16, 8, 4, 4, 4, 8}));
  CHECK(scaler.hysteresis_left() == 2);  // restored when the scale grew

  loom::zero_loss_scaler fixed({.enabled = true, .loss_scale = 128});
  CHECK_FALSE(fixed.dynamic());
  fixed.update(true);
  CHECK(fixed.scale() == 128.0);

  // State round trip under DeepSpeed's names.
  loom::zero_loss_scaler restored;
  restored.load_state_dict(scaler.state_dict());
  CHECK(restored.scale() == 8.0);
  CHECK(restored.iteration() == 10);
  CHECK_THROWS_WITH(restored.load_state_dict(c10::IValue(3)), Catch::Contains("not a dict"));
}

TEST_CASE("ZeRO's loss scaler skips the step on injected inf or nan gradients", "[precision][scaler][zero]") {
  const float poison = GENERATE(std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN());
  loom::zero_loss_scaler scaler({.enabled = true, .initial_scale_power = 8, .hysteresis = 1});
  tiny t;
  scaler.scale_loss(t.loss()).backward();
  CHECK(torch::equal(t.weight.grad(), at::tensor({256.0F, 512.0F, 768.0F})));
  t.weight.mutable_grad()[1] = poison;
  const auto before = t.weight.detach().clone();
  CHECK_FALSE(scaler.step(t.optimizer));
  CHECK(torch::equal(t.weight.detach(), before));  // untouched
  CHECK(scaler.scale() == 128.0);                  // hysteresis 1: halved at once
  t.optimizer.zero_grad();
  scaler.scale_loss(t.loss()).backward();
  CHECK(scaler.step(t.optimizer));                 // finite: unscaled exactly, stepped
  CHECK(torch::allclose(t.weight, at::tensor({0.9F, 0.8F, 0.7F})));
}
