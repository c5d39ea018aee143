// A small decoder-only transformer trained on real text, byte by byte: the
// fortune files of Debian's `fortunes` package (regular files only, sorted by
// name and concatenated; the last 10% held out for validation). It prints the
// unigram and bigram cross-entropies of the validation part under the
// training part's counts (what a model must beat), progress, and as its last
// line val_loss=X (nats per byte).
//
// One binary for every strategy: make_fabric picks it (command line or
// loom-run's flags). Under model_parallel the model's parallelize_fn below is
// the plan: a vocabulary-parallel embedding, each block's attention heads and
// MLP split column-wise then row-wise, and a column-wise head whose logits
// are gathered. Every configuration runs the same optimizer steps on the same
// global batches (drawn from the seed and the step), so their losses agree.
//
//   build/examples/char_transformer [--max-steps N] [--data DIR] [--threads T]
//   build/tools/loom-run --strategy model_parallel --devices 2 build/examples/char_transformer
//   build/tools/loom-run --strategy model_parallel --devices 4 build/examples/char_transformer
//       --data-parallel-size 2 --tensor-parallel-size 2     (data parallel 2 x tensor parallel 2)
#include "char_transformer_model.hpp"

#include <loom/any_fabric.hpp>
#include <loom/loom.hpp>
#include <loom/runtime/make_fabric_with_strategy.hpp>
#include <loom/runtime/registry.hpp>

#include <CLI/CLI.hpp>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using char_transformer::CharTransformer;
using char_transformer::parallelize;
using char_transformer::vocabulary;

struct options {
  std::string data = "/usr/share/games/fortunes";
  int64_t max_steps = 750;
  int64_t batch_size = 32;  // global: split over the data-parallel ranks
  int64_t context = 128;
  int64_t dim = 128;
  int64_t heads = 4;
  int64_t layers = 3;
  double lr = 3e-3;
  int64_t warmup = 100;
  double clip = 1.0;
  std::uint64_t seed = 1;
  int64_t log_every = 100;
  int64_t limit_val_batches = 0;  // N x batch_size held-out windows; 0: all of them
  int threads = 0;  // 0: the cores over the processes of this node
  int data_parallel_size = 0;
  int tensor_parallel_size = 0;
  std::string accelerator = "auto";
  std::string strategy = "auto";
  std::optional<std::string> devices;
  std::optional<std::string> precision;
  int num_nodes = 1;
};

// ------------------------------------------------------------------ data

// The regular files of the directory (not the .dat indexes, not the .u8
// symlinks, which repeat the same text), sorted by name, concatenated.
std::vector<std::uint8_t> read_corpus(const std::string& directory, int& files) {
  namespace fs = std::filesystem;
  std::vector<fs::path> paths;
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    throw std::runtime_error("char_transformer: " + directory + " is not a directory; install Debian's fortunes "
                             "(apt-get install fortunes) or pass --data DIR");
  }
  for (const auto& entry : fs::directory_iterator(directory)) {
    if (!entry.is_regular_file() || entry.is_symlink() || entry.path().extension() == ".dat") continue;
    paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::uint8_t> bytes;
  for (const auto& path : paths) {
    std::ifstream in(path, std::ios::binary);
    bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  files = static_cast<int>(paths.size());
  if (bytes.size() < 10000) {
    throw std::runtime_error("char_transformer: " + directory + " holds " + std::to_string(bytes.size()) +
                             " bytes of text in " + std::to_string(files) +
                             " files; install Debian's fortunes (apt-get install fortunes) or pass --data DIR");
  }
  return bytes;
}

// Cross-entropy (nats per byte) of `held_out` under add-one-smoothed
// unigram and bigram counts of `train`.
std::pair<double, double> ngram_baselines(const at::Tensor& train, const at::Tensor& held_out) {
  const at::Tensor t = train.to(at::kLong), v = held_out.to(at::kLong);
  const at::Tensor unigram = at::bincount(t, {}, vocabulary).to(at::kDouble) + 1.0;
  const at::Tensor unigram_logp = (unigram / unigram.sum()).log();
  const double uni = -unigram_logp.index_select(0, v).mean().item<double>();
  const at::Tensor pairs = t.narrow(0, 0, t.numel() - 1) * vocabulary + t.narrow(0, 1, t.numel() - 1);
  const at::Tensor bigram = at::bincount(pairs, {}, vocabulary * vocabulary).to(at::kDouble).view({vocabulary, vocabulary}) + 1.0;
  const at::Tensor bigram_logp = (bigram / bigram.sum(1, true)).log();
  const at::Tensor held_pairs = v.narrow(0, 0, v.numel() - 1) * vocabulary + v.narrow(0, 1, v.numel() - 1);
  const double bi = -bigram_logp.view({-1}).index_select(0, held_pairs).mean().item<double>();
  return {uni, bi};
}

// The global batch of step `step`: the same on every rank and under every
// strategy (windows drawn from the seed and the step).
std::pair<at::Tensor, at::Tensor> global_batch(const at::Tensor& train, const options& opts, int64_t step) {
  auto generator = at::detail::createCPUGenerator(opts.seed * 1000003 + static_cast<std::uint64_t>(step));
  const at::Tensor starts = at::randint(0, train.numel() - opts.context - 1, {opts.batch_size}, generator);
  const at::Tensor index = starts.unsqueeze(1) + at::arange(opts.context + 1, at::kLong);
  const at::Tensor windows = train.index_select(0, index.view({-1})).view({opts.batch_size, opts.context + 1}).to(at::kLong);
  return {windows.narrow(1, 0, opts.context), windows.narrow(1, 1, opts.context)};
}

// ------------------------------------------------------------------ training

struct data_position {
  int rank = 0;      // among the data-parallel ranks
  int replicas = 1;  // data-parallel ranks
};

// Mean loss (nats per byte) over every window of the validation text (or its
// first --limit-val-batches x --batch-size windows: the same windows in every
// layout), the windows dealt over the data-parallel ranks.
template <class Fabric, class Model>
double validation_loss(Fabric& fabric, Model& model, const at::Tensor& held_out, const options& opts,
                       const data_position& where) {
  at::NoGradGuard no_grad;
  model->eval();
  int64_t windows = (held_out.numel() - 1) / opts.context;
  if (opts.limit_val_batches > 0) windows = std::min(windows, opts.limit_val_batches * opts.batch_size);
  const at::Tensor usable = held_out.narrow(0, 0, windows * opts.context + 1).to(at::kLong);
  const at::Tensor inputs = usable.narrow(0, 0, windows * opts.context).view({windows, opts.context});
  const at::Tensor targets = usable.narrow(0, 1, windows * opts.context).view({windows, opts.context});
  double sum = 0;
  int64_t count = 0;
  for (int64_t first = 0; first < windows; first += opts.batch_size * where.replicas) {
    const int64_t begin = std::min(windows, first + where.rank * opts.batch_size);
    const int64_t end = std::min(windows, begin + opts.batch_size);
    // Every rank runs the forward (tensor-parallel ranks share it), some on no rows.
    const at::Tensor logits = model(inputs.narrow(0, begin, end - begin));
    sum += torch::nn::functional::cross_entropy(
               logits.reshape({-1, vocabulary}), targets.narrow(0, begin, end - begin).reshape({-1}),
               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
               .template item<double>();
    count += (end - begin) * opts.context;
  }
  model->train();
  const at::Tensor totals = fabric.all_reduce(at::tensor({sum, static_cast<double>(count)}, at::kDouble),
                                              loom::reduce_op::sum);
  // Tensor-parallel ranks counted the same rows: the ratio is unchanged.
  return totals[0].template item<double>() / totals[1].template item<double>();
}

template <class Fabric>
double run(Fabric& fabric, const options& opts, const data_position& where) {
  int files = 0;
  const std::vector<std::uint8_t> bytes = read_corpus(opts.data, files);
  const at::Tensor text = at::from_blob(const_cast<std::uint8_t*>(bytes.data()), {static_cast<int64_t>(bytes.size())},
                                        at::kByte)
                              .clone();
  const int64_t split = text.numel() - text.numel() / 10;
  const at::Tensor train = text.narrow(0, 0, split), held_out = text.narrow(0, split, text.numel() - split);
  const auto [unigram, bigram] = ngram_baselines(train, held_out);
  std::ostringstream intro;
  intro << std::fixed << std::setprecision(2) << "text: " << files << " files, " << text.numel() << " bytes from "
        << opts.data << " (train " << train.numel() << ", validation " << held_out.numel()
        << "); validation cross-entropy under the training counts: unigram " << unigram << ", bigram " << bigram
        << " nats/byte";
  fabric.print(intro.str());

  fabric.seed_everything(opts.seed);
  CharTransformer net(char_transformer::shape{opts.context, opts.dim, opts.heads, opts.layers});
  int64_t parameters = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(opts.lr).betas({0.9, 0.99}).weight_decay(0.01));
  auto [model, optimizer] = fabric.setup(net, adamw);  // model_parallel: parallelize_fn sets `where`
  if (opts.batch_size % where.replicas != 0) {
    throw loom::configuration_error("char_transformer: --batch-size " + std::to_string(opts.batch_size) +
                                    " does not split over " + std::to_string(where.replicas) + " data-parallel ranks");
  }
  std::ostringstream shape;
  shape << "model: " << opts.layers << " layers, dim " << opts.dim << ", " << opts.heads << " heads, context "
        << opts.context << ", " << parameters << " parameters | strategy " << fabric.strategy_name() << " on "
        << fabric.world_size() << " process(es) (data parallel " << where.replicas << "), precision "
        << fabric.precision_name() << ", " << at::get_num_threads() << " thread(s) each | " << opts.max_steps
        << " steps of " << opts.batch_size << " x " << opts.context << " bytes";
  fabric.print(shape.str());

  const int64_t local = opts.batch_size / where.replicas;
  const auto start = std::chrono::steady_clock::now();
  double running = 0;
  int64_t running_steps = 0;
  for (int64_t step = 1; step <= opts.max_steps; ++step) {
    // Linear warmup, then cosine decay to a tenth.
    const double progress = static_cast<double>(step - opts.warmup) / static_cast<double>(std::max<int64_t>(1, opts.max_steps - opts.warmup));
    const double factor = step <= opts.warmup ? static_cast<double>(step) / static_cast<double>(opts.warmup)
                                              : 0.1 + 0.45 * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(opts.lr * factor);
    }
    const auto [inputs, targets] = global_batch(train, opts, step);
    const at::Tensor x = inputs.narrow(0, where.rank * local, local), y = targets.narrow(0, where.rank * local, local);
    optimizer.zero_grad();
    const at::Tensor loss =
        torch::nn::functional::cross_entropy(model(x).reshape({-1, vocabulary}), y.reshape({-1}));
    fabric.backward(loss);
    if (opts.clip > 0) fabric.clip_gradients(model, optimizer, loom::clip_options{.max_norm = opts.clip});
    optimizer.step();
    // The global batch's loss: the mean over the data-parallel ranks.
    const double global = fabric.all_reduce(loss.detach().to(at::kDouble), loom::reduce_op::mean).template item<double>();
    running += global;
    ++running_steps;
    if (step % opts.log_every == 0 || step == opts.max_steps) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::ostringstream line;
      line << "step " << step << "/" << opts.max_steps << "  loss " << std::fixed << std::setprecision(6) << global
           << "  mean " << std::setprecision(4) << running / static_cast<double>(running_steps) << "  lr "
           << std::setprecision(5) << opts.lr * factor << "  " << std::setprecision(1) << seconds << " s";
      fabric.print(line.str());
      running = 0;
      running_steps = 0;
    }
  }
  const double val = validation_loss(fabric, model, held_out, opts, where);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ostringstream done;
  done << std::fixed << std::setprecision(1) << "trained and validated in " << seconds << " s";
  fabric.print(done.str());
  return val;
}

int train(options opts) {
  loom::fabric_config config{.accelerator = opts.accelerator, .strategy = opts.strategy, .num_nodes = opts.num_nodes};
  if (opts.devices) config.devices = *opts.devices;
  if (opts.precision) config.precision = *opts.precision;
  const loom::runtime::resolution resolved = loom::runtime::resolve(config, std::nullopt);
  const int processes = std::max(1, resolved.chosen.processes_per_node);
  const int threads = opts.threads > 0 ? opts.threads
                                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / processes);
  at::set_num_threads(threads);

  data_position where;
  auto body = [&](auto& fabric) {
    fabric.launch();  // --devices N without loom-run: starts the other N-1 processes
    if (resolved.chosen.strategy != "model_parallel") {
      where = {fabric.global_rank(), fabric.world_size()};
    }
    const double val = run(fabric, opts, where);
    std::cout << std::flush;
    fabric.barrier();
    if (fabric.is_global_zero()) std::printf("val_loss=%.4f\n", val);
    std::fflush(stdout);
    return 0;
  };
  if (resolved.chosen.strategy == "model_parallel") {
    // The plan is code: the strategy is given as an object (Lightning's
    // Fabric(strategy=ModelParallelStrategy(parallelize_fn))).
    config.strategy = "auto";
    loom::model_parallel strategy(loom::model_parallel_options{
        .parallelize_fn =
            [&where](torch::nn::Module& module, loom::comm::device_mesh& mesh) {
              where = {mesh.coordinate("data_parallel"), mesh.size("data_parallel")};
              parallelize(module, mesh);
            },
        .data_parallel_size = opts.data_parallel_size,
        .tensor_parallel_size = opts.tensor_parallel_size});
    loom::AnyFabric fabric = loom::make_fabric(std::move(config), std::move(strategy));
    return body(fabric);
  }
  loom::AnyFabric fabric = loom::make_fabric(std::move(config));
  return body(fabric);
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  CLI::App app("A character-level transformer on the fortunes text with loom::Fabric");
  app.add_option("--data", opts.data, "directory of text files (Debian's fortunes)");
  app.add_option("--max-steps,--max_steps", opts.max_steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--batch-size,--batch_size", opts.batch_size, "global batch (windows per step)")
      ->check(CLI::PositiveNumber);
  app.add_option("--context", opts.context, "window length in bytes")->check(CLI::PositiveNumber);
  app.add_option("--dim", opts.dim, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", opts.heads, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--layers", opts.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--lr", opts.lr, "AdamW peak learning rate")->check(CLI::PositiveNumber);
  app.add_option("--warmup", opts.warmup, "linear warmup steps")->check(CLI::PositiveNumber);
  app.add_option("--clip", opts.clip, "gradient norm clip (0: none)");
  app.add_option("--seed", opts.seed, "seed for weights and batches");
  app.add_option("--log-every,--log_every", opts.log_every, "progress line every N steps")->check(CLI::PositiveNumber);
  app.add_option("--limit-val-batches,--limit_val_batches", opts.limit_val_batches,
                 "validate on the first N x batch-size held-out windows (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", opts.threads, "threads per process (0: cores / processes of this node)");
  app.add_option("--data-parallel-size", opts.data_parallel_size, "model_parallel: data-parallel size (0: nodes)");
  app.add_option("--tensor-parallel-size", opts.tensor_parallel_size,
                 "model_parallel: tensor-parallel size (0: processes per node)");
  app.add_option("--accelerator", opts.accelerator, "cpu | cuda | gpu | auto");
  app.add_option("--strategy", opts.strategy, "a strategy name (model_parallel, ddp, ...) or auto");
  app.add_option("--devices", opts.devices, "processes (cpu) or devices (cuda): a count, auto, or indices");
  app.add_option("--precision", opts.precision, "32-true | bf16-mixed | bf16-true | ...");
  app.add_option("--num-nodes,--num_nodes", opts.num_nodes, "nodes of the job")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return train(opts);
  } catch (const std::exception& error) {
    std::cerr << "char_transformer: " << error.what() << '\n';
    return 1;
  }
}
