// The trainer on real processes, for tests/dist/trainer.sh:
//
//   trainer_worker fit DIR MAX_STEPS [--resume last] [--accum N] [--count-syncs]
//       fits an MLP with dropout (Adam, one-cycle schedule, shuffled data) through
//       make_fabric (single_device, or what loom-run says), checkpoints under
//       DIR/ckpt, logs CSV under DIR/logs, and writes the final weights to
//       DIR/final.ckpt. --count-syncs (DDP) counts the gradient collectives of
//       each optimizer step and prints them.
//   trainer_worker compare A B
//       whether the "model" entries of two checkpoints are bit-identical.
#include <loom/any_fabric.hpp>
#include <loom/checkpoint/io.hpp>
#include <loom/loggers/csv_logger.hpp>
#include <loom/loom.hpp>
#include <loom/trainer/trainer.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, 32))),
        fc3(register_module("fc3", torch::nn::Linear(32, 3))),
        dropout(register_module("dropout", torch::nn::Dropout(0.3))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto h = dropout->forward(torch::relu(fc1->forward(x)));
    return fc3->forward(dropout->forward(torch::relu(fc2->forward(h))));
  }
  at::Tensor training_step(const torch::data::Example<>& batch, std::int64_t /*batch_idx*/) {
    return torch::nn::functional::cross_entropy(forward(batch.data), batch.target);
  }
  loom::optimization<torch::optim::Adam> configure_optimizers() {
    auto adam = std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2));
    loom::lr_scheduler schedule(*adam, loom::one_cycle_lr{.max_lr = 2e-2, .total_steps = 1000});
    return {.optimizer = adam, .scheduler = std::move(schedule)};
  }
  torch::nn::Linear fc1, fc2, fc3;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(Net);

loom::data::tensor_dataset synthetic() {
  auto generator = at::detail::createCPUGenerator(99);
  const at::Tensor inputs = at::randn({200, 8}, generator);
  const at::Tensor targets = at::matmul(inputs, at::randn({8, 3}, generator)).argmax(1);
  return loom::data::tensor_dataset(inputs, targets);
}

// Counts the DDP gradient collectives of each optimizer step.
struct sync_counter {
  const loom::ddp* strategy = nullptr;
  std::uint64_t before = 0;
  std::vector<std::uint64_t> per_step;
  std::size_t buckets = 0;
  void on_before_zero_grad(torch::optim::Optimizer& /*optimizer*/) {
    if (strategy == nullptr) return;
    buckets = strategy->gradient_buckets();  // while the fit's module (and its engine) is alive
    const std::uint64_t now = strategy->gradient_collectives();
    per_step.push_back(now - before);
    before = now;
  }
};

int fit(int argc, char** argv) {
  if (argc < 4) throw std::invalid_argument("fit DIR MAX_STEPS [--resume last] [--accum N] [--count-syncs]");
  const std::string dir = argv[2];
  const std::int64_t max_steps = std::stoll(argv[3]);
  std::string resume;
  std::int64_t accumulation = 1;
  bool count_syncs = false;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--resume") == 0 && i + 1 < argc) resume = argv[++i];
    else if (std::strcmp(argv[i], "--accum") == 0 && i + 1 < argc) accumulation = std::stoll(argv[++i]);
    else if (std::strcmp(argv[i], "--count-syncs") == 0) count_syncs = true;
    else if (std::strncmp(argv[i], "loom-test-", 10) == 0) continue;  // the test's process mark
    else throw std::invalid_argument(std::string("unknown argument ") + argv[i]);
  }
  sync_counter counter;
  loom::AnyFabric fabric = loom::make_fabric(
      {.loggers = {loom::csv_logger(dir + "/logs", {.name = "csv"})}, .callbacks = {std::ref(counter)}});
  fabric.launch();
  if (count_syncs) {
    auto* ddp = fabric.target<loom::Fabric<loom::cpu, loom::ddp, loom::fp32>>();
    if (ddp == nullptr) throw std::invalid_argument("--count-syncs needs loom-run --strategy ddp (32-true)");
    counter.strategy = &ddp->strategy();
  }
  fabric.seed_everything(7);
  Net net;
  loom::trainer trainer(fabric, {.max_epochs = 1000,
                                 .max_steps = max_steps,
                                 .grad_accum_steps = accumulation,
                                 .checkpoint_dir = dir + "/ckpt",
                                 .checkpoint_frequency = 2,
                                 .log_every_n_steps = 1,
                                 .progress_bar = {.enabled = false},
                                 .log_throughput = false});
  const auto result = trainer.fit(net, synthetic(), {.train_loader = {.batch_size = 10, .shuffle = true},
                                                     .resume = resume});
  fabric.save(dir + "/final.ckpt", {{"model", net}});
  if (fabric.is_global_zero()) {
    std::printf("fit: world_size=%d epochs=%lld steps=%lld checkpoint=%s\n", fabric.world_size(),
                static_cast<long long>(result.epochs), static_cast<long long>(result.global_step),
                result.last_checkpoint.c_str());
    if (count_syncs) {
      std::printf("syncs per optimizer step:");
      for (auto n : counter.per_step) std::printf(" %llu", static_cast<unsigned long long>(n));
      std::printf(" | buckets=%zu micro-batches per step=%lld\n", counter.buckets, static_cast<long long>(accumulation));
    }
  }
  std::fflush(stdout);
  return 0;
}

int compare(const std::string& a, const std::string& b) {
  const auto left = loom::read_checkpoint(a).entries.at("model").toGenericDict();
  const auto right = loom::read_checkpoint(b).entries.at("model").toGenericDict();
  if (left.size() != right.size()) {
    std::printf("different: %zu vs %zu tensors\n", left.size(), right.size());
    return 1;
  }
  double worst = 0;
  bool identical = true;
  for (const auto& item : left) {
    const at::Tensor x = item.value().toTensor();
    const at::Tensor y = right.at(item.key()).toTensor();
    if (!at::equal(x, y)) {
      identical = false;
      worst = std::max(worst, (x - y).abs().max().item<double>());
    }
  }
  if (identical) std::printf("bit-identical: %zu tensors\n", left.size());
  else std::printf("different: max |a - b| = %.3g\n", worst);
  return identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 2 && std::strcmp(argv[1], "fit") == 0) return fit(argc, argv);
    if (argc == 4 && std::strcmp(argv[1], "compare") == 0) return compare(argv[2], argv[3]);
    std::cerr << "usage: trainer_worker fit DIR MAX_STEPS [...] | compare A B\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "trainer_worker: " << error.what() << '\n';
    return 1;
  }
}
