// An external program that uses an installed loom: one training step of a
// Linear through a Fabric. Built by the consumer tests three ways (pkg-config,
// CMake's find_package, a Meson subproject); exits 0 when the step changed
// the weights.
#include <loom/loom.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <iostream>

int main() {
  loom::Fabric<loom::cpu> fabric;
  at::manual_seed(0);
  torch::nn::Linear linear(4, 1);
  torch::optim::SGD sgd(linear->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(linear, sgd);
  const at::Tensor x = at::randn({8, 4});
  const at::Tensor y = x.sum(1, /*keepdim=*/true);
  const at::Tensor before = linear->weight.detach().clone();
  optimizer.zero_grad();
  const at::Tensor loss = torch::nn::functional::mse_loss(model(x), y);
  fabric.backward(loss);
  optimizer.step();
  const bool trained = !at::equal(before, linear->weight.detach());
  std::cout << "consumer: " << (trained ? "trained one step" : "the step changed nothing") << ", loss "
            << loss.item<double>() << std::endl;
  return trained ? 0 : 1;
}
