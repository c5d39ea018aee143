// Fits a small CNN on Fashion-MNIST with loom::trainer (Lightning's "build
// your own trainer", in C++): progress bar, CSV and TensorBoard logs,
// checkpoints (periodic, best by val_accuracy, last), early stopping, LR
// monitor, throughput with the FLOPs loom measured. The last line is
// val_accuracy=0.XXXX. Device, strategy and precision come from the flags or
// from loom-run (LT_*), through make_fabric.
//
//   build/examples/trainer [--epochs 3] [--batch-size 64] [--lr 2e-3] [--grad-accum 1]
//                          [--resume last|PATH] [--data DIR] [--log-dir logs] [--checkpoint-dir checkpoints]
//   build/tools/loom-run --strategy ddp --devices 2 build/examples/trainer
#include <loom/any_fabric.hpp>
#include <loom/data/fashion_mnist.hpp>
#include <loom/loggers/csv_logger.hpp>
#include <loom/loggers/tensorboard_logger.hpp>
#include <loom/trainer/callbacks/early_stopping.hpp>
#include <loom/trainer/callbacks/lr_monitor.hpp>
#include <loom/trainer/callbacks/model_checkpoint.hpp>
#include <loom/trainer/trainer.hpp>
#include <loom/util/flop_counter.hpp>

#include <CLI/CLI.hpp>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

namespace {

struct hyper {
  std::int64_t epochs = 3;
  std::size_t batch_size = 64;
  double lr = 2e-3;
  double weight_decay = 1e-4;
  std::int64_t grad_accum = 1;
  std::int64_t channels = 16;
};

// The trainable module: a LibTorch module with Lightning's three members.
struct FashionCnnImpl : torch::nn::Module {
  FashionCnnImpl(hyper h, std::int64_t steps_per_epoch)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, h.channels, 3).padding(1)))),
        conv2(register_module("conv2",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(h.channels, 2 * h.channels, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(2 * h.channels * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))),
        dropout(register_module("dropout", torch::nn::Dropout(0.25))),
        hp(h),
        total_steps(h.epochs * steps_per_epoch) {}

  at::Tensor forward(const at::Tensor& images) {
    namespace F = torch::nn::functional;
    auto x = F::max_pool2d(torch::relu(conv1->forward(images)), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(torch::relu(conv2->forward(x)), F::MaxPool2dFuncOptions(2));
    x = dropout->forward(torch::relu(fc1->forward(x.flatten(1))));
    return fc2->forward(x);
  }

  loom::step_output training_step(const torch::data::Example<>& batch, std::int64_t /*batch_idx*/) {
    const at::Tensor logits = forward(batch.data);
    const at::Tensor loss = torch::nn::functional::cross_entropy(logits, batch.target);
    return {loss, {{"train_accuracy", logits.argmax(1).eq(batch.target).to(at::kFloat).mean()}}};
  }

  loom::step_output validation_step(const torch::data::Example<>& batch, std::int64_t /*batch_idx*/) {
    const at::Tensor logits = forward(batch.data);
    return {torch::nn::functional::cross_entropy(logits, batch.target),
            {{"val_accuracy", logits.argmax(1).eq(batch.target).to(at::kFloat).mean()}}};
  }

  loom::optimization<torch::optim::AdamW> configure_optimizers() {
    auto adamw = std::make_shared<torch::optim::AdamW>(
        parameters(), torch::optim::AdamWOptions(hp.lr).weight_decay(hp.weight_decay));
    // Optimizer steps over the whole fit: batches / accumulation, rounded up per epoch.
    loom::lr_scheduler schedule(*adamw, loom::one_cycle_lr{.max_lr = hp.lr, .total_steps = total_steps});
    return {.optimizer = adamw, .scheduler = std::move(schedule), .interval = loom::scheduler_interval::step};
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout dropout;
  hyper hp;
  std::int64_t total_steps;
};
TORCH_MODULE(FashionCnn);

struct options {
  hyper hp;
  std::string data = loom::data::fashion_mnist_default_root;
  std::string log_dir = "logs";
  std::string checkpoint_dir = "checkpoints";
  std::string resume;
  std::optional<std::int64_t> max_steps;
  std::optional<std::int64_t> limit_train_batches;
  std::uint64_t seed = 42;
  std::string accelerator = "auto";
  std::string strategy = "auto";
  std::optional<std::string> devices;
  std::optional<std::string> precision;
  std::optional<double> peak_flops;
};

int run(const options& opts) {
  loom::fabric_config config{.accelerator = opts.accelerator, .strategy = opts.strategy};
  if (opts.devices) config.devices = *opts.devices;
  if (opts.precision) config.precision = *opts.precision;
  config.loggers.emplace_back(loom::csv_logger(opts.log_dir, {.name = "csv"}));
  config.loggers.emplace_back(loom::tensorboard_logger(opts.log_dir, {.name = "tensorboard"}));
  config.callbacks.emplace_back(loom::model_checkpoint(
      {.monitor = "val_accuracy", .mode = loom::monitor_mode::max, .save_top_k = 1, .save_last = true}));
  config.callbacks.emplace_back(loom::early_stopping({.monitor = "val_loss", .patience = 2}));
  config.callbacks.emplace_back(loom::lr_monitor({.log_momentum = true}));
  loom::AnyFabric fabric = loom::make_fabric(std::move(config));
  fabric.launch();
  fabric.seed_everything(opts.seed);

  auto train_set = loom::data::fashion_mnist(opts.data, loom::data::split::train);
  auto val_set = loom::data::fashion_mnist(opts.data, loom::data::split::test);
  const auto samples_per_rank = (*train_set.size() + fabric.world_size() - 1) / fabric.world_size();
  std::int64_t batches = static_cast<std::int64_t>((samples_per_rank + opts.hp.batch_size - 1) / opts.hp.batch_size);
  if (opts.limit_train_batches) batches = std::min(batches, *opts.limit_train_batches);
  const std::int64_t steps_per_epoch = (batches + opts.hp.grad_accum - 1) / opts.hp.grad_accum;

  FashionCnn model(opts.hp, steps_per_epoch);
  // FLOPs of one training batch (forward and backward), for throughput and MFU.
  const at::Tensor probe = at::zeros({static_cast<std::int64_t>(opts.hp.batch_size), 1, 28, 28});
  const double flops_per_batch = loom::measure_flops(model, probe).total();
  fabric.print("fashion-mnist:", *train_set.size(), "training and", *val_set.size(), "validation images | strategy",
               fabric.strategy_name(), "on", fabric.world_size(), "process(es), precision",
               std::string(fabric.precision_name()), "|", flops_per_batch / 1e6, "MFLOP per batch");
  for (auto& sink : fabric.loggers()) {
    if (!fabric.is_global_zero()) break;
    sink.log_hyperparams({{"lr", opts.hp.lr},
                          {"batch_size", static_cast<std::int64_t>(opts.hp.batch_size)},
                          {"epochs", opts.hp.epochs},
                          {"grad_accum_steps", opts.hp.grad_accum},
                          {"channels", opts.hp.channels},
                          {"strategy", std::string(fabric.strategy_name())},
                          {"precision", std::string(fabric.precision_name())}});
  }

  loom::trainer trainer(fabric, {.max_epochs = opts.hp.epochs,
                                 .max_steps = opts.max_steps,
                                 .grad_accum_steps = opts.hp.grad_accum,
                                 .limit_train_batches = opts.limit_train_batches,
                                 .checkpoint_dir = opts.checkpoint_dir,
                                 .gradient_clip_val = 5.0,
                                 .flops_per_batch = flops_per_batch,
                                 .available_flops = opts.peak_flops});
  const loom::fit_result result = trainer.fit(
      model, std::move(train_set), std::move(val_set),
      {.train_loader = {.batch_size = opts.hp.batch_size, .shuffle = true},
       .val_loader = {.batch_size = 1000},
       .resume = opts.resume});

  std::cout << std::flush;
  std::cerr << std::flush;
  fabric.barrier();  // every rank is done printing
  if (fabric.is_global_zero()) {
    std::printf("fit: %lld epoch(s), %lld step(s), last checkpoint %s\n", static_cast<long long>(result.epochs),
                static_cast<long long>(result.global_step), result.last_checkpoint.c_str());
    const auto accuracy = result.metrics.find("val_accuracy");
    std::printf("val_accuracy=%.4f\n", accuracy == result.metrics.end() ? 0.0 : accuracy->second);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  CLI::App app("Fashion-MNIST with loom::trainer");
  app.add_option("--epochs", opts.hp.epochs, "epochs (max_epochs)")->check(CLI::PositiveNumber);
  app.add_option("--batch-size,--batch_size", opts.hp.batch_size, "batch size per process")->check(CLI::PositiveNumber);
  app.add_option("--lr", opts.hp.lr, "peak learning rate of the one-cycle schedule (AdamW)")->check(CLI::PositiveNumber);
  app.add_option("--grad-accum,--grad_accum", opts.hp.grad_accum, "batches per optimizer step")->check(CLI::PositiveNumber);
  app.add_option("--channels", opts.hp.channels, "channels of the first convolution")->check(CLI::PositiveNumber);
  app.add_option("--max-steps,--max_steps", opts.max_steps, "stop after this many optimizer steps");
  app.add_option("--limit-train-batches,--limit_train_batches", opts.limit_train_batches, "batches per epoch");
  app.add_option("--resume", opts.resume, "last (the newest checkpoint in --checkpoint-dir) or a checkpoint's path");
  app.add_option("--data", opts.data, "directory with the Fashion-MNIST IDX files");
  app.add_option("--log-dir,--log_dir", opts.log_dir, "CSV logs under <dir>/csv, TensorBoard under <dir>/tensorboard");
  app.add_option("--checkpoint-dir,--checkpoint_dir", opts.checkpoint_dir, "checkpoints go here");
  app.add_option("--seed", opts.seed, "seed for weights, dropout and shuffling");
  app.add_option("--peak-flops,--peak_flops", opts.peak_flops, "one device's peak FLOP/s, to log MFU");
  app.add_option("--accelerator", opts.accelerator, "cpu | cuda | gpu | auto");
  app.add_option("--strategy", opts.strategy, "a registered strategy name or auto");
  app.add_option("--devices", opts.devices, "processes (cpu) or devices (cuda)");
  app.add_option("--precision", opts.precision, "32-true | bf16-mixed | ...");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(opts);
  } catch (const std::exception& error) {
    std::cerr << "trainer: " << error.what() << '\n';
    return 1;
  }
}
