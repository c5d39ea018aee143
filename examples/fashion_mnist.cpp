// Trains an MLP on Fashion-MNIST through loom's Fabric and prints, as its last
// line, test_accuracy=0.XXXX. The data are the IDX files from Debian's
// dataset-fashion-mnist (or --data DIR). Device, strategy and precision come
// from the command line or from loom-run (LT_*), through make_fabric, as a
// Lightning script's do under `fabric run`.
//
//   build/examples/fashion_mnist [--epochs 5] [--batch-size 64] [--lr 1e-3] [--data DIR]
//                                [--accelerator cpu] [--strategy ddp] [--devices 2] [--precision bf16-mixed]
//                                [--empty-init true|false] [--count-memory]
#include <loom/any_fabric.hpp>
#include <loom/runtime/registry.hpp>
#include <loom/util/counting_allocator.hpp>
#include <loom/loom.hpp>

#include <CLI/CLI.hpp>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <chrono>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

namespace {

// Each Linear a loom::unit: under fsdp and deepspeed a unit of sharding
// (Lightning: FSDPStrategy(auto_wrap_policy={nn.Linear})), and built inside
// init_module(true) it keeps only this rank's shard from its constructor on;
// under any other strategy exactly a Linear.
struct ClassifierImpl : torch::nn::Module {
  explicit ClassifierImpl(int64_t hidden)
      : fc1(register_module("fc1", loom::unit<torch::nn::Linear>(784, hidden))),
        fc2(register_module("fc2", loom::unit<torch::nn::Linear>(hidden, hidden / 2))),
        fc3(register_module("fc3", loom::unit<torch::nn::Linear>(hidden / 2, 10))),
        dropout(register_module("dropout", torch::nn::Dropout(0.2))) {}

  at::Tensor forward(const at::Tensor& images) {
    auto x = torch::relu(fc1->forward(images.flatten(1)));
    x = dropout->forward(torch::relu(fc2->forward(dropout->forward(x))));
    return fc3->forward(x);
  }

  loom::unit<torch::nn::Linear> fc1, fc2, fc3;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(Classifier);

struct options {
  std::string data = loom::data::fashion_mnist_default_root;
  int epochs = 5;
  std::size_t batch_size = 64;
  double lr = 1e-3;
  int64_t hidden = 512;
  std::uint64_t seed = 42;
  std::string log_dir = "logs";
  std::string checkpoint;
  int log_every = 200;
  // Lightning's Fabric(...) arguments; not given: auto, or loom-run's values.
  std::string accelerator = "auto";
  std::string strategy = "auto";
  std::optional<std::string> devices;
  std::optional<std::string> precision;
  int num_nodes = 1;
  bool empty_init = true;     // build inside init_module(true)
  bool count_memory = false;  // print the build + setup peak of tensor bytes
};

template <class Fabric, class Model, class Loader>
double accuracy(Fabric& fabric, Model& model, Loader& loader) {
  at::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0;
  int64_t seen = 0;
  for (auto& batch : loader) {
    correct += model(batch.data).argmax(1).eq(batch.target).sum().template item<int64_t>();
    seen += batch.target.size(0);
  }
  model->train();
  const auto totals = fabric.all_reduce(at::tensor({correct, seen}), loom::reduce_op::sum);
  return static_cast<double>(totals[0].template item<int64_t>()) / static_cast<double>(totals[1].template item<int64_t>());
}

// The bytes of the distinct storages behind a module's parameters: after
// FSDP's setup this rank's flat shards.
std::int64_t parameter_bytes(const torch::nn::Module& module) {
  std::set<const void*> seen;
  std::int64_t total = 0;
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.storage().unsafeGetStorageImpl()).second) total += static_cast<std::int64_t>(p.storage().nbytes());
  }
  return total;
}
// The model's parameter bytes by shape (what one process holds whole).
std::int64_t model_parameter_bytes(const torch::nn::Module& module) {
  std::set<const void*> seen;
  std::int64_t total = 0;
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) total += p.numel() * static_cast<std::int64_t>(p.element_size());
  }
  return total;
}

template <class Fabric>
double run(Fabric& fabric, const options& opts) {
  fabric.seed_everything(opts.seed);
  auto train_set = loom::data::fashion_mnist(opts.data, loom::data::split::train);
  auto test_set = loom::data::fashion_mnist(opts.data, loom::data::split::test);
  fabric.print("fashion-mnist:", train_set.size().value(), "training and", test_set.size().value(),
               "test images from", opts.data, "| strategy", fabric.strategy_name(), "on", fabric.world_size(),
               "process(es), precision", std::string(fabric.precision_name()));

  // --count-memory: tensor bytes from here to the end of setup (the data
  // are loaded above), through the counting allocator main() installed.
  loom::counting_allocator* counter = opts.count_memory ? &loom::install_counting_allocator() : nullptr;
  const std::int64_t before_model = counter != nullptr ? counter->live() : 0;
  if (counter != nullptr) counter->reset_peak();
  // Under fsdp and deepspeed stage 3 each unit keeps only its shard from its
  // constructor on (Lightning's empty_init=True); elsewhere no effect.
  Classifier net = [&] {
    auto init = fabric.init_module(opts.empty_init);
    return Classifier(opts.hidden);
  }();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(opts.lr));
  const std::int64_t model_bytes = model_parameter_bytes(*net);
  auto [model, optimizer] = fabric.setup(net, adam);
  if (counter != nullptr) {
    fabric.print("build_and_setup_peak_bytes_per_rank=" + std::to_string(counter->peak() - before_model) +
                 " (rank 0's tensors, init_module(" + (opts.empty_init ? "true" : "false") + "))");
  }
  // What this rank holds of the parameters (FSDP: its shards).
  const std::int64_t held_bytes = parameter_bytes(*net);
  auto train = fabric.setup_dataloaders(std::move(train_set), {.batch_size = opts.batch_size, .shuffle = true});
  auto test = fabric.setup_dataloaders(std::move(test_set), {.batch_size = 1000});

  const auto steps_per_epoch = static_cast<int64_t>(train.size().value());
  int64_t step = 0;
  double test_accuracy = 0.0;
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 1; epoch <= opts.epochs; ++epoch) {
    double loss_sum = 0.0;
    int64_t batch_idx = 0;
    for (auto& batch : train) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
      fabric.backward(loss);
      optimizer.step();
      const double value = loss.template item<double>();
      loss_sum += value;
      ++batch_idx;
      ++step;
      if (step % 50 == 0) fabric.log_dict({{"train_loss", value}, {"epoch", std::int64_t{epoch}}}, step);
      if (batch_idx % opts.log_every == 0 || batch_idx == steps_per_epoch) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::ostringstream line;
        line << "epoch " << epoch << "/" << opts.epochs << "  step " << batch_idx << "/" << steps_per_epoch
             << "  loss " << std::fixed << std::setprecision(4) << loss_sum / static_cast<double>(batch_idx)
             << "  " << std::setprecision(0) << static_cast<double>(step) / seconds << " it/s";
        fabric.print(line.str());
      }
    }
    test_accuracy = accuracy(fabric, model, test);
    fabric.log("test_accuracy", test_accuracy, step);
    std::ostringstream line;
    line << "epoch " << epoch << " done: test accuracy " << std::fixed << std::setprecision(4) << test_accuracy;
    fabric.print(line.str());
  }
  for (auto& logger : fabric.loggers()) logger.finalize("success");
  fabric.print("param_bytes_per_rank=" + std::to_string(held_bytes) + " model_param_bytes=" +
               std::to_string(model_bytes));
  if (!opts.checkpoint.empty()) {
    fabric.save(opts.checkpoint, {{"model", model}, {"optimizer", optimizer}, {"step", step}});
    fabric.print("checkpoint written to", opts.checkpoint);
  }
  return test_accuracy;
}

int train(const options& opts) {
  loom::fabric_config config{.accelerator = opts.accelerator, .strategy = opts.strategy, .num_nodes = opts.num_nodes};
  if (opts.devices) config.devices = *opts.devices;
  if (opts.precision) config.precision = *opts.precision;
  if (!opts.log_dir.empty()) config.loggers.emplace_back(loom::csv_logger(opts.log_dir, {.name = "fashion_mnist"}));
  loom::AnyFabric fabric = loom::make_fabric(std::move(config));
  fabric.launch();  // --devices N without loom-run: starts the other N-1 processes
  const double test_accuracy = run(fabric, opts);  // reduced over every rank
  std::cout << std::flush;
  fabric.barrier();  // the other ranks are done printing
  if (fabric.is_global_zero()) std::printf("test_accuracy=%.4f\n", test_accuracy);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  CLI::App app("Fashion-MNIST with loom::Fabric (strategy and precision from loom-run's flags)");
  app.add_option("--data", opts.data, "directory with the Fashion-MNIST IDX files (.gz or plain)");
  app.add_option("--epochs", opts.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size,--batch_size", opts.batch_size, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--lr", opts.lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--hidden", opts.hidden, "width of the first hidden layer")->check(CLI::Range(2, 1 << 16));
  app.add_option("--seed", opts.seed, "seed for weights and shuffling");
  app.add_option("--log-dir,--log_dir", opts.log_dir, "CSV logs go under this directory ('' for none)");
  app.add_option("--checkpoint", opts.checkpoint, "write a checkpoint here at the end");
  app.add_option("--log-every,--log_every", opts.log_every, "progress line every N steps")->check(CLI::PositiveNumber);
  app.add_option("--accelerator", opts.accelerator, "cpu | cuda | gpu | auto");
  app.add_option("--strategy", opts.strategy, "a registered strategy name (see docs/registry.md) or auto");
  app.add_option("--devices", opts.devices, "processes (cpu) or devices (cuda): a count, auto, or indices");
  app.add_option("--precision", opts.precision, "32-true | 64-true | bf16-mixed | bf16-true | 16-mixed | ...");
  app.add_option("--num-nodes,--num_nodes", opts.num_nodes, "nodes of the job")->check(CLI::PositiveNumber);
  app.add_option("--empty-init,--empty_init", opts.empty_init,
                 "build the model inside init_module(true): under fsdp and deepspeed stage 3 each Linear keeps only "
                 "this rank's shard from its constructor on")
      ->capture_default_str();
  app.add_flag("--count-memory,--count_memory", opts.count_memory,
               "print build_and_setup_peak_bytes_per_rank= (rank 0's tensor bytes from the model's build to the end "
               "of setup, counted by loom::counting_allocator)");
  CLI11_PARSE(app, argc, argv);

  try {
    return train(opts);
  } catch (const std::exception& error) {
    std::cerr << "fashion_mnist: " << error.what() << '\n';
    return 1;
  }
}
