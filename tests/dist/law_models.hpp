// What the sharded strategies' workers share (fsdp_worker.cpp,
// zero_worker.cpp): the small models the laws train, the training steps
// (rank r's rows of the global batch), saving in a loop for the kill tests,
// and the one-process checks of a checkpoint left behind.
#pragma once

#include "strategy_laws.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace laws {

// Two blocks declared as units, a plain head in the root unit.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", loom::unit<torch::nn::Linear>(16, 32))),
        fc2(register_module("fc2", loom::unit<torch::nn::Linear>(32, 32))),
        fc3(register_module("fc3", torch::nn::Linear(32, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  loom::unit<torch::nn::Linear> fc1, fc2;
  torch::nn::Linear fc3;
};
TORCH_MODULE(Net);

// Only plain modules: units come from auto_wrap_policy (or ZeRO's reduce_bucket_size).
struct PlainNetImpl : torch::nn::Module {
  PlainNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(16, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, 32))),
        fc3(register_module("fc3", torch::nn::Linear(32, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(PlainNet);

// A unit of two layers whose forward, or backward between them, throws
// where planted() says (law_failed_step).
struct PairImpl : torch::nn::Module {
  PairImpl()
      : a(register_module("a", torch::nn::Linear(32, 32))), b(register_module("b", torch::nn::Linear(32, 32))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = torch::relu(a(x));
    throw_if_planted(planted_failure::forward);
    if (h.requires_grad()) {
      h.register_hook([](const at::Tensor& grad) {
        throw_if_planted(planted_failure::backward);
        return grad;
      });
    }
    return b(h);
  }
  torch::nn::Linear a, b;
};
struct FailingNetImpl : torch::nn::Module {
  FailingNetImpl()
      : fc1(register_module("fc1", loom::unit<torch::nn::Linear>(16, 32))),
        fc2(register_module("fc2", loom::unit<PairImpl>())),
        fc3(register_module("fc3", torch::nn::Linear(32, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  loom::unit<torch::nn::Linear> fc1;
  loom::unit<PairImpl> fc2;
  torch::nn::Linear fc3;
};
TORCH_MODULE(FailingNet);

inline FailingNet make_failing() {
  at::manual_seed(42);
  return FailingNet();
}
inline Net make_net() {
  at::manual_seed(42);
  return Net();
}
inline PlainNet make_plain() {
  at::manual_seed(42);
  return PlainNet();
}

// Steps from..to-1 (rank r's rows of each global batch) through a set-up model.
template <class F, class M, class O>
void train_steps(F& fabric, M& model, O& optimizer, int from, int to) {
  const int r = fabric.global_rank();
  const int64_t local = global_batch / fabric.world_size();
  for (int step = from; step < to; ++step) {
    optimizer.zero_grad();
    fabric.backward(torch::nn::functional::cross_entropy(model(global_inputs(step).narrow(0, r * local, local)),
                                                         global_targets(step).narrow(0, r * local, local)));
    optimizer.step();
  }
}

// Saves a checkpoint at TEST_DIR/killed after every step until killed (the kill tests).
template <class F>
[[noreturn]] void save_forever(F& fabric) {
  const std::string path = test_dir() + "/killed";
  auto net = make_net();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  std::printf("rank %d pid %d saving\n", fabric.global_rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  for (int step = 0;; ++step) {
    train_steps(fabric, model, optimizer, step, step + 1);
    fabric.save(path, {{"model", model}, {"optimizer", optimizer}, {"step", step}});
  }
}

// A damaged copy of a checkpoint is refused with an error naming `expected`,
// and the model and optimizer are unchanged (one process). Prints the error.
inline int load_damaged(const std::string& path, const std::string& expected) {
  loom::Fabric<loom::cpu, loom::single_device> single;
  auto net = make_net();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = single.setup(net, adam);
  const auto before = flat_of(net);
  try {
    single.load(path, {{"model", model}, {"optimizer", optimizer}});
    std::printf("load_damaged: %s loaded, but it is damaged\n", path.c_str());
    return 1;
  } catch (const loom::checkpoint_error& error) {
    const bool named = std::string(error.what()).find(expected) != std::string::npos;
    const bool unchanged = torch::equal(flat_of(net), before) && adam.state().empty();
    std::printf("load_damaged: %s (names %s: %s; model and optimizer unchanged: %s)\n", error.what(),
                expected.c_str(), named ? "yes" : "no", unchanged ? "yes" : "no");
    return named && unchanged ? 0 : 1;
  }
}

// The kill tests' check: what PATH holds loads, complete, into single_device.
inline int load_check(const std::string& path) {
  try {
    loom::Fabric<loom::cpu, loom::single_device> single;
    auto net = make_net();
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
    auto [model, optimizer] = single.setup(net, adam);
    auto rest = single.load(path, {{"model", model}, {"optimizer", optimizer}});
    std::printf("load_check: %s loads (step %d)\n", path.c_str(), rest.get<int>("step"));
    return 0;
  } catch (const std::exception& error) {
    std::printf("load_check: %s does not load: %s\n", path.c_str(), error.what());
    return 1;
  }
}

}  // namespace laws
