// The model of the FSDP benchmarks: MLP 784-1024-1024-1024-10 (2,913,290
// parameters, as facts-sharding.md measured PyTorch with), each Linear a
// loom::unit (under any other strategy, a plain Linear).
#pragma once

#include <loom/strategy/unit.hpp>

#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace loom_bench {

struct WideMlpImpl : torch::nn::Module {
  WideMlpImpl()
      : fc1(register_module("fc1", loom::unit<torch::nn::Linear>(784, 1024))),
        fc2(register_module("fc2", loom::unit<torch::nn::Linear>(1024, 1024))),
        fc3(register_module("fc3", loom::unit<torch::nn::Linear>(1024, 1024))),
        fc4(register_module("fc4", loom::unit<torch::nn::Linear>(1024, 10))) {}
  at::Tensor forward(const at::Tensor& x) {
    return fc4(torch::relu(fc3(torch::relu(fc2(torch::relu(fc1(x)))))));
  }
  loom::unit<torch::nn::Linear> fc1, fc2, fc3, fc4;
};
TORCH_MODULE(WideMlp);

inline constexpr std::int64_t wide_mlp_parameters = 2'913'290;

}  // namespace loom_bench
