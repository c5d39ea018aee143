// The same training step with raw LibTorch and no loom: what the user's own
// code costs to compile (compile-time benchmark, bench/compile_time.sh).
#include <torch/torch.h>

#include <iostream>

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(784, 256))), fc2(register_module("fc2", torch::nn::Linear(256, 10))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

int main() {
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.01);
  const at::Tensor x = torch::randn({64, 784});
  const at::Tensor y = torch::randint(0, 10, {64});
  at::Tensor loss;
  for (int step = 0; step < 10; ++step) {
    sgd.zero_grad();
    loss = torch::nn::functional::cross_entropy(net(x), y);
    loss.backward();
    sgd.step();
  }
  std::cout << "loss " << loss.item<double>() << '\n';
  return 0;
}
