#include <loom/loom.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  // Device, strategy and precision are types: change one (loom::bf16_mixed) and rebuild.
  loom::Fabric<loom::cpu, loom::single_device, loom::fp32> fabric;

  torch::nn::Linear net(784, 10);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  auto train = fabric.setup_dataloaders(
      loom::data::fashion_mnist(loom::data::fashion_mnist_default_root, loom::data::split::train),
      {.batch_size = 64, .shuffle = true});

  for (auto& batch : train) {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(batch.data.flatten(1)), batch.target);
    fabric.backward(loss);
    optimizer.step();
  }
  fabric.save("linear.ckpt", {{"model", model}, {"optimizer", optimizer}});
}
