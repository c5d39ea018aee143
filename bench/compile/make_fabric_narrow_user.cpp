// The make_fabric program of make_fabric_user.cpp with the narrow LibTorch
// headers it uses instead of <torch/torch.h>, as loom's own TUs include them
// (compile-time benchmark, bench/compile_time.sh).
#include <loom/any_fabric.hpp>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(784, 256))), fc2(register_module("fc2", torch::nn::Linear(256, 10))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  auto fabric = loom::make_fabric({.strategy = argc > 1 ? argv[1] : "auto", .precision = "bf16-mixed"});
  fabric.launch();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.01);
  auto [model, optimizer] = fabric.setup(net, sgd);
  const at::Tensor x = torch::randn({64, 784});
  const at::Tensor y = torch::randint(0, 10, {64});
  for (int step = 0; step < 10; ++step) {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(x), y);
    fabric.backward(loss);
    optimizer.step();
  }
  fabric.print("loss", fabric.all_reduce(torch::ones({1}), loom::reduce_op::mean).item<double>());
  return 0;
}
