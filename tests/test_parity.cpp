// Laws: training through Fabric is training without it. The same MLP, seed
// and batches give bit-identical weights raw and through Fabric (fp32, fp64);
// bf16-mixed computes Linear layers in bf16 and keeps fp32 weights and grads.
#include "allocation_counter.hpp"
#include "test_models.hpp"

#include "catch.hpp"
#include <loom/loom.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <numeric>

using loom_test::Mlp;

namespace {

constexpr int64_t steps = 200;
constexpr int64_t batch = 64;
constexpr int64_t features = 784;
constexpr int64_t classes = 10;
constexpr uint64_t model_seed = 1234;

torch::optim::SGDOptions sgd_options() { return torch::optim::SGDOptions(0.05).momentum(0.9); }

// The plain LibTorch loop. `compute` is the dtype of weights and inputs;
// outputs return to fp32 before the loss, as the "-true" precisions do.
Mlp train_raw(const loom_test::synthetic_task& task, c10::ScalarType compute) {
  at::manual_seed(model_seed);
  Mlp model = [&] {
    loom::default_dtype_guard dtype(compute);
    return Mlp(features, 256, classes);
  }();
  torch::optim::SGD optimizer(model->parameters(), sgd_options());
  for (int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    auto output = model->forward(task.inputs[step].to(compute)).to(at::kFloat);
    auto loss = torch::nn::functional::cross_entropy(output, task.targets[step]);
    loss.backward();
    optimizer.step();
  }
  return model;
}

template <class Precision>
Mlp train_fabric(const loom_test::synthetic_task& task) {
  loom::Fabric<loom::cpu, loom::single_device, Precision> fabric;
  at::manual_seed(model_seed);
  Mlp net = [&] {
    auto init = fabric.init_module();
    return Mlp(features, 256, classes);
  }();
  torch::optim::SGD sgd(net->parameters(), sgd_options());
  auto [model, optimizer] = fabric.setup(net, sgd);
  for (int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    auto output = model(task.inputs[step]);
    auto loss = torch::nn::functional::cross_entropy(output, task.targets[step]);
    fabric.backward(loss);
    optimizer.step();
  }
  return net;
}

void require_bit_identical(const Mlp& expected, const Mlp& actual) {
  auto want = expected->named_parameters();
  auto got = actual->named_parameters();
  REQUIRE(want.size() == got.size());
  for (const auto& item : want) {
    INFO("parameter " << item.key());
    REQUIRE(got[item.key()].scalar_type() == item.value().scalar_type());
    REQUIRE(torch::equal(got[item.key()], item.value()));
  }
}

}  // namespace

TEST_CASE("fp32: 200 steps through Fabric give bit-identical weights to the raw loop", "[parity]") {
  const auto task = loom_test::make_task(steps, batch, features, classes, 99);
  auto raw = train_raw(task, at::kFloat);
  auto through_fabric = train_fabric<loom::fp32>(task);
  require_bit_identical(raw, through_fabric);
  // And training did something: the weights moved away from their init.
  at::manual_seed(model_seed);
  Mlp untrained(features, 256, classes);
  CHECK_FALSE(torch::equal(untrained->fc1->weight, raw->fc1->weight));
}

TEST_CASE("fp64: 200 steps through Fabric give bit-identical weights to the raw loop", "[parity]") {
  const auto task = loom_test::make_task(steps, batch, features, classes, 99);
  auto raw = train_raw(task, at::kDouble);
  auto through_fabric = train_fabric<loom::fp64>(task);
  REQUIRE(through_fabric->fc1->weight.scalar_type() == at::kDouble);
  require_bit_identical(raw, through_fabric);
}

namespace {
// Losses of a training run through Fabric with precision P.
template <class P>
std::vector<double> fabric_losses(const loom_test::synthetic_task& task, bool check_dtypes) {
  loom::Fabric<loom::cpu, loom::single_device, P> fabric;
  at::manual_seed(model_seed);
  Mlp net(features, 256, classes);
  torch::optim::SGD sgd(net->parameters(), sgd_options());
  auto [model, optimizer] = fabric.setup(net, sgd);
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    auto output = model(task.inputs[step]);
    auto loss = torch::nn::functional::cross_entropy(output, task.targets[step]);
    if (check_dtypes) {
      REQUIRE(net->hidden_dtype == at::kBFloat16);
      REQUIRE(output.scalar_type() == at::kFloat);  // converted back, as Lightning does
      REQUIRE(loss.scalar_type() == at::kFloat);
    }
    fabric.backward(loss);
    if (check_dtypes) {
      for (const auto& parameter : net->parameters()) {
        REQUIRE(parameter.scalar_type() == at::kFloat);
        REQUIRE(parameter.grad().scalar_type() == at::kFloat);
      }
    }
    optimizer.step();
    losses.push_back(loss.template item<double>());
  }
  return losses;
}

double mean(std::vector<double>::const_iterator first, std::vector<double>::const_iterator last) {
  return std::accumulate(first, last, 0.0) / static_cast<double>(last - first);
}
}  // namespace

TEST_CASE("bf16-mixed: Linear activations are bf16, weights and gradients fp32, and the loss falls", "[parity]") {
  const auto task = loom_test::make_task(steps, batch, features, classes, 7);
  const auto bf16 = fabric_losses<loom::bf16_mixed>(task, /*check_dtypes=*/true);
  const auto fp32 = fabric_losses<loom::fp32>(task, /*check_dtypes=*/false);
  const double first = mean(bf16.begin(), bf16.begin() + 20);
  const double last = mean(bf16.end() - 20, bf16.end());
  const double last_fp32 = mean(fp32.end() - 20, fp32.end());
  INFO("bf16-mixed: mean loss of the first 20 steps " << first << ", of the last 20 " << last
                                                      << "; fp32's last 20: " << last_fp32);
  // Fresh batches every step, so the loss falls from ln(10) ~ 2.30 towards
  // what 200 steps allow; bf16 rounding (8-bit mantissa) costs little.
  CHECK(last < 0.7 * first);
  CHECK(std::abs(last - last_fp32) < 0.1 * last_fp32);
}

TEST_CASE("bf16-mixed turns autocast on only inside the wrapped forward and fabric.autocast()", "[precision]") {
  loom::Fabric<loom::cpu, loom::single_device, loom::bf16_mixed> fabric;
  Mlp net(8, 16, 3);
  auto model = fabric.setup(net);
  const auto x = at::randn({2, 8});
  model(x);
  CHECK(net->hidden_dtype == at::kBFloat16);
  CHECK_FALSE(loom::compat::autocast_enabled(c10::DeviceType::CPU));
  net->forward(x);
  CHECK(net->hidden_dtype == at::kFloat);
  {
    auto context = fabric.autocast();
    net->forward(x);
    CHECK(net->hidden_dtype == at::kBFloat16);
  }
  CHECK_FALSE(loom::compat::autocast_enabled(c10::DeviceType::CPU));
}

TEST_CASE("bf16-true converts the module and floating inputs, and returns fp32 outputs", "[precision]") {
  loom::Fabric<loom::cpu, loom::single_device, loom::bf16> fabric;
  Mlp net = [&] {
    auto init = fabric.init_module();
    CHECK(c10::get_default_dtype_as_scalartype() == at::kBFloat16);
    return Mlp(8, 16, 3);
  }();
  CHECK(c10::get_default_dtype_as_scalartype() == at::kFloat);  // restored
  CHECK(net->fc1->weight.scalar_type() == at::kBFloat16);
  auto model = fabric.setup(net);
  auto output = model(at::randn({4, 8}));
  CHECK(net->hidden_dtype == at::kBFloat16);
  CHECK(output.scalar_type() == at::kFloat);
  // Integer inputs are not floating point and stay as they are.
  CHECK(loom::bf16{}.convert_input(at::arange(3)).scalar_type() == at::kLong);
}

TEST_CASE("setup converts a module built in fp32 to the true precision, integer buffers untouched", "[precision]") {
  struct CountingImpl : torch::nn::Module {
    CountingImpl() {
      linear = register_module("linear", torch::nn::Linear(4, 4));
      steps = register_buffer("steps", at::zeros({}, at::kLong));
    }
    at::Tensor forward(const at::Tensor& x) { return linear->forward(x); }
    torch::nn::Linear linear{nullptr};
    at::Tensor steps;
  };
  auto net = std::make_shared<CountingImpl>();
  loom::Fabric<loom::cpu, loom::single_device, loom::fp64> fabric;
  auto model = fabric.setup(net);
  CHECK(net->linear->weight.scalar_type() == at::kDouble);
  CHECK(net->steps.scalar_type() == at::kLong);
  CHECK(model(at::ones({2, 4})).scalar_type() == at::kFloat);
}

TEST_CASE("fp32 forward through Fabric is the module's forward", "[parity]") {
  loom::Fabric<loom::cpu> fabric;
  at::manual_seed(3);
  Mlp net(8, 16, 3);
  auto model = fabric.setup(net);
  const auto x = at::randn({5, 8});
  CHECK(torch::equal(model(x), net->forward(x)));
  CHECK(model->fc1.ptr() == net->fc1.ptr());
  CHECK(fabric.device() == c10::Device(c10::DeviceType::CPU));
  CHECK(fabric.world_size() == 1);
  CHECK(fabric.is_global_zero());
}

namespace {
// Heap allocations of 20 training steps, after 5 steps of warm-up.
template <class Step>
unsigned long long allocations_in_20_steps(Step&& step) {
  for (int i = 0; i < 5; ++i) step();
  const auto before = loom_test::allocation_count();
  for (int i = 0; i < 20; ++i) step();
  return loom_test::allocation_count() - before;
}
}  // namespace

TEST_CASE("a step through Fabric makes no heap allocation beyond the raw step's", "[parity]") {
  const auto task = loom_test::make_task(1, batch, features, classes, 5);
  const auto x = task.inputs[0];
  const auto y = task.targets[0];

  Mlp raw_net(features, 256, classes);
  torch::optim::SGD raw_sgd(raw_net->parameters(), sgd_options());
  const auto raw = allocations_in_20_steps([&] {
    raw_sgd.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(raw_net->forward(x), y);
    loss.backward();
    raw_sgd.step();
  });

  loom::Fabric<loom::cpu> fabric;
  Mlp net(features, 256, classes);
  torch::optim::SGD sgd(net->parameters(), sgd_options());
  auto [model, optimizer] = fabric.setup(net, sgd);
  const auto through_fabric = allocations_in_20_steps([&] {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(x), y);
    fabric.backward(loss);
    optimizer.step();
  });
  INFO("heap allocations in 20 steps: raw " << raw << ", through Fabric " << through_fabric);
  CHECK(raw > 0);  // the counter sees LibTorch's own allocations
  CHECK(through_fabric == raw);
}
