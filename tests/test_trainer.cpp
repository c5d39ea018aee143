// loom::trainer and its parts: LR schedulers against torch's numbers,
// gradient accumulation (steps counted, equivalence with a 4x batch),
// callbacks (early stopping, model checkpoint, LR monitor), loggers (CSV
// resume, TensorBoard read back by an independent Python reader), FLOP
// counts against hand-computed ones, throughput against a fixed clock, the
// progress line.
#include "test_models.hpp"

#include "catch.hpp"
#include <loom/environment.hpp>
#include <loom/loggers/csv_logger.hpp>
#include <loom/loggers/tensorboard_logger.hpp>
#include <loom/loom.hpp>
#include <loom/trainer/callbacks/early_stopping.hpp>
#include <loom/trainer/callbacks/lr_monitor.hpp>
#include <loom/trainer/callbacks/model_checkpoint.hpp>
#include <loom/trainer/checkpoint_files.hpp>
#include <loom/trainer/trainer.hpp>
#include <loom/util/flop_counter.hpp>
#include <loom/util/throughput.hpp>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using loom_test::scratch_dir;

// ------------------------------------------------------------ schedulers
struct schedule_row {
  std::vector<double> lrs;
  std::vector<double> momenta;
};

// lr_schedules.txt, written by Debian's python3-torch: case -> rows by step.
std::map<std::string, std::vector<schedule_row>> read_schedules() {
  std::ifstream in(loom_test::fixtures_dir() + "/lr_schedules.txt");
  REQUIRE(in.good());
  std::map<std::string, std::vector<schedule_row>> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name, token;
    int step = 0;
    fields >> name >> step;
    schedule_row row;
    bool momentum = false;
    while (fields >> token) {
      if (token == "|") momentum = true;
      else (momentum ? row.momenta : row.lrs).push_back(std::stod(token));
    }
    out[name].push_back(row);
  }
  return out;
}

std::vector<at::Tensor> two_params() { return {at::zeros({2}, at::requires_grad()), at::zeros({2}, at::requires_grad())}; }

// Steps scheduler alongside torch's rows and checks every lr and momentum.
void expect_same_schedule(torch::optim::Optimizer& optimizer, loom::lr_scheduler& scheduler,
                          const std::vector<schedule_row>& rows) {
  REQUIRE(!rows.empty());
  for (std::size_t step = 0; step < rows.size(); ++step) {
    INFO("step " << step);
    const auto lrs = loom::learning_rates(optimizer);
    REQUIRE(lrs.size() == rows[step].lrs.size());
    for (std::size_t g = 0; g < lrs.size(); ++g) CHECK(lrs[g] == rows[step].lrs[g]);  // the same doubles
    if (!rows[step].momenta.empty()) {
      const auto moms = loom::momenta(optimizer);
      REQUIRE(moms.size() == rows[step].momenta.size());
      for (std::size_t g = 0; g < moms.size(); ++g) CHECK(moms[g] == rows[step].momenta[g]);
    }
    if (step + 1 < rows.size()) scheduler.step();
  }
}

std::vector<torch::optim::OptimizerParamGroup> sgd_groups(std::vector<at::Tensor>& p, double lr0, double lr1) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p[0]}, std::make_unique<torch::optim::SGDOptions>(lr0));
  groups.emplace_back(std::vector<at::Tensor>{p[1]}, std::make_unique<torch::optim::SGDOptions>(lr1));
  return groups;
}

TEST_CASE("lr schedulers give torch.optim.lr_scheduler's numbers, step by step", "[trainer]") {
  const auto rows = read_schedules();
  SECTION("StepLR, two groups") {
    auto p = two_params();
    torch::optim::SGD sgd(sgd_groups(p, 0.1, 0.03), torch::optim::SGDOptions(0.1));
    loom::lr_scheduler scheduler(sgd, loom::step_lr{.step_size = 3, .gamma = 0.5});
    expect_same_schedule(sgd, scheduler, rows.at("step"));
  }
  SECTION("MultiStepLR with a repeated milestone") {
    auto p = two_params();
    torch::optim::SGD sgd(sgd_groups(p, 0.1, 0.03), torch::optim::SGDOptions(0.1));
    loom::lr_scheduler scheduler(sgd, loom::multi_step_lr{.milestones = {2, 5, 5, 9}, .gamma = 0.3});
    expect_same_schedule(sgd, scheduler, rows.at("multistep"));
  }
  SECTION("OneCycleLR on SGD: lr and momentum") {
    auto p = two_params();
    torch::optim::SGD sgd(p, torch::optim::SGDOptions(0.1).momentum(0.9));
    loom::lr_scheduler scheduler(sgd, loom::one_cycle_lr{.max_lr = 0.5, .total_steps = 20});
    expect_same_schedule(sgd, scheduler, rows.at("onecycle_sgd"));
    CHECK_THROWS_WITH(scheduler.step(), Catch::Contains("total_steps=20"));
  }
  SECTION("OneCycleLR on Adam: three phases, linear, per-group max_lr through groups") {
    // torch takes max_lr per group; loom takes one max_lr, so each group is its own scheduler here.
    const auto& expected = rows.at("onecycle_adam_linear_3phase");
    for (int g = 0; g < 2; ++g) {
      auto p = two_params();
      torch::optim::Adam adam(std::vector<at::Tensor>{p[g]}, torch::optim::AdamOptions(1e-3));
      loom::lr_scheduler scheduler(adam, loom::one_cycle_lr{.max_lr = g == 0 ? 0.01 : 0.02,
                                                            .total_steps = 17,
                                                            .pct_start = 0.25,
                                                            .anneal_strategy = loom::one_cycle_lr::anneal::linear,
                                                            .div_factor = 10.0,
                                                            .final_div_factor = 100.0,
                                                            .three_phase = true});
      std::vector<schedule_row> group_rows;
      for (const auto& row : expected) group_rows.push_back({{row.lrs[g]}, {row.momenta[g]}});
      expect_same_schedule(adam, scheduler, group_rows);
    }
  }
  SECTION("cosine with linear warm-up, as torch's LambdaLR with the documented factor") {
    auto p = two_params();
    torch::optim::AdamW adamw(p, torch::optim::AdamWOptions(0.004));
    loom::lr_scheduler scheduler(adamw, loom::cosine_warmup_lr{.warmup_steps = 4, .total_steps = 14,
                                                               .warmup_start_factor = 0.1, .min_lr_factor = 0.05});
    expect_same_schedule(adamw, scheduler, rows.at("cosine_warmup"));
  }
}

TEST_CASE("an lr scheduler saved mid-schedule and loaded into a fresh one continues identically", "[trainer]") {
  auto run = [](int split) {
    auto p = two_params();
    torch::optim::SGD sgd(p, torch::optim::SGDOptions(0.1).momentum(0.9));
    loom::lr_scheduler scheduler(sgd, loom::one_cycle_lr{.max_lr = 0.5, .total_steps = 30});
    for (int i = 0; i < split; ++i) scheduler.step();
    const c10::IValue saved = scheduler.state_dict();
    auto q = two_params();
    torch::optim::SGD fresh(q, torch::optim::SGDOptions(0.1).momentum(0.9));
    loom::lr_scheduler restored(fresh, loom::one_cycle_lr{.max_lr = 0.5, .total_steps = 30});
    restored.load_state_dict(saved);
    std::vector<double> out;
    for (int i = split; i < 30; ++i) {
      restored.step();
      out.push_back(loom::learning_rates(fresh)[0]);
      out.push_back(loom::momenta(fresh)[0]);
    }
    return out;
  };
  const auto straight = run(0);
  const auto resumed = run(11);
  REQUIRE(resumed.size() == straight.size() - 22);
  for (std::size_t i = 0; i < resumed.size(); ++i) CHECK(resumed[i] == straight[i + 22]);

  auto p = two_params();
  torch::optim::SGD sgd(p, torch::optim::SGDOptions(0.1));
  loom::lr_scheduler step(sgd, loom::step_lr{.step_size = 2});
  auto q = two_params();
  torch::optim::SGD other(q, torch::optim::SGDOptions(0.1));
  const c10::IValue multi_step_state = loom::lr_scheduler(other, loom::multi_step_lr{}).state_dict();
  CHECK_THROWS_WITH(step.load_state_dict(multi_step_state), Catch::Contains("holds a MultiStepLR schedule, not a StepLR"));
  // As torch: one-cycle cycles momentum by default, which Adagrad does not have.
  torch::optim::Adagrad adagrad(q, torch::optim::AdagradOptions(0.1));
  CHECK_THROWS_WITH(loom::lr_scheduler(adagrad, loom::one_cycle_lr{.max_lr = 0.1, .total_steps = 10}),
                    Catch::Contains("cycle_momentum needs an optimizer with momentum"));
}

// ------------------------------------------------------------ the trainer
// A trainable MLP on a synthetic task; counts what the trainer calls.
struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl(double lr = 0.1) : fc1(register_module("fc1", torch::nn::Linear(8, 16))),
                                    fc2(register_module("fc2", torch::nn::Linear(16, 3))),
                                    lr(lr) {}
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  at::Tensor training_step(const torch::data::Example<>& batch, std::int64_t /*batch_idx*/) {
    ++training_steps;
    return torch::nn::functional::cross_entropy(forward(batch.data), batch.target);
  }
  loom::step_output validation_step(const torch::data::Example<>& batch, std::int64_t /*batch_idx*/) {
    const at::Tensor logits = forward(batch.data);
    return {torch::nn::functional::cross_entropy(logits, batch.target),
            {{"val_accuracy", logits.argmax(1).eq(batch.target).to(at::kFloat).mean()}}};
  }
  std::shared_ptr<torch::optim::SGD> configure_optimizers() {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(lr));
  }
  torch::nn::Linear fc1, fc2;
  double lr;
  int training_steps = 0;
};
TORCH_MODULE(Classifier);

loom::data::tensor_dataset synthetic(std::int64_t size, std::uint64_t seed = 3) {
  auto task = loom_test::make_task(1, size, 8, 3, seed);
  return loom::data::tensor_dataset(task.inputs[0], task.targets[0]);
}

at::Tensor flat(torch::nn::Module& module) {
  std::vector<at::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().flatten());
  return at::cat(parts);
}

// Records, per optimizer step, the batch index it came after.
struct step_recorder {
  std::vector<std::int64_t> batches;
  std::vector<std::int64_t> steps_after_batch;
  std::int64_t last_batch = -1;
  void on_train_batch_end(const at::Tensor& /*loss*/, std::int64_t batch_idx) { last_batch = batch_idx; }
  void on_before_optimizer_step(torch::optim::Optimizer& /*optimizer*/) { steps_after_batch.push_back(last_batch); }
  void on_train_batch_start(std::int64_t batch_idx) { batches.push_back(batch_idx); }
};

loom::trainer_options quiet(loom::trainer_options options, const std::string& dir) {
  options.progress_bar.enabled = false;
  options.checkpoint_dir = dir;
  return options;
}

TEST_CASE("grad_accum_steps counts micro-batches: a step per 4 batches, and one on the partial window at epoch end",
          "[trainer]") {
  scratch_dir dir("trainer-accum");
  step_recorder recorder;
  loom::Fabric<loom::cpu> fabric({.callbacks = {std::ref(recorder)}});
  loom::trainer trainer(fabric, quiet({.max_epochs = 2, .grad_accum_steps = 4, .checkpoint_frequency = 0}, dir.path().string()));
  Classifier model;
  // 40 samples, batches of 4: 10 batches per epoch -> windows of 4, 4 and 2.
  const auto result = trainer.fit(model, synthetic(40), {.train_loader = {.batch_size = 4, .shuffle = true}});
  const std::vector<std::int64_t> expected{3, 7, 9, 3, 7, 9};
  CHECK(recorder.steps_after_batch == expected);
  CHECK(result.global_step == 6);
  CHECK(result.epochs == 2);
  CHECK(model->training_steps == 20);
  // Lightning's example decides with global_step % grad_accum_steps, which
  // counts optimizer steps: it would step after batch 0 and never again.
  CHECK(recorder.steps_after_batch.size() != 1);
}

TEST_CASE("accumulating 4 batches of 8 gives the weights of one batch of 32", "[trainer]") {
  scratch_dir dir("trainer-accum-equal");
  auto fit = [&](std::size_t batch, std::int64_t accumulation) {
    at::manual_seed(11);
    Classifier model;
    loom::Fabric<loom::cpu> fabric;
    loom::trainer trainer(fabric, quiet({.max_epochs = 3, .grad_accum_steps = accumulation, .checkpoint_frequency = 0},
                                        dir.path().string()));
    trainer.fit(model, synthetic(64), {.train_loader = {.batch_size = batch, .shuffle = false}});
    return flat(*model);
  };
  const at::Tensor accumulated = fit(8, 4);
  const at::Tensor full = fit(32, 1);
  // Same data, same mean loss; only the float32 summation order differs
  // (four partial sums of 8 against one of 32), ~1e-7 relative per step.
  CHECK(at::allclose(accumulated, full, 1e-5, 1e-6));
  CHECK(!at::equal(accumulated, flat(*Classifier())));
}

TEST_CASE("validation metrics are averaged over the whole set, logged, and drive early stopping", "[trainer]") {
  scratch_dir dir("trainer-validation");
  loom::early_stopping stopper({.monitor = "val_loss", .patience = 1, .stopping_threshold = 1e9});
  auto csv = std::make_shared<loom::csv_logger>(dir.path().string(), loom::csv_logger_options{.name = "run", .version = std::int64_t{0}});
  loom::Fabric<loom::cpu> fabric({.loggers = {csv}, .callbacks = {std::ref(stopper)}});
  loom::trainer trainer(fabric, quiet({.max_epochs = 5, .log_every_n_steps = 1}, dir.path().string()));
  Classifier model;
  const auto result = trainer.fit(model, synthetic(30), synthetic(25, 9),
                                  {.train_loader = {.batch_size = 8}, .val_loader = {.batch_size = 10}});
  // stopping_threshold 1e9 on val_loss (min): any finite loss is "good enough", so it stops after the first validation.
  CHECK(result.stopped_by_callback);
  CHECK(result.epochs == 1);
  CHECK_THAT(stopper.reason(), Catch::Contains("Stopping threshold reached: val_loss"));
  // The mean over 25 samples in batches of 10, 10, 5, weighted by batch size.
  at::NoGradGuard no_grad;
  auto val = synthetic(25, 9);
  const at::Tensor logits = model->forward(val.inputs());
  const double expected_loss = torch::nn::functional::cross_entropy(logits, val.targets()).item<double>();
  const double expected_accuracy = logits.argmax(1).eq(val.targets()).to(at::kDouble).mean().item<double>();
  CHECK(result.metrics.at("val_loss") == Approx(expected_loss).epsilon(1e-6));
  // Each batch's accuracy is a float32 mean (0.3f, 0.4f...): float32 rounding.
  CHECK(result.metrics.at("val_accuracy") == Approx(expected_accuracy).epsilon(1e-6));
  csv->save();
  std::ifstream in(csv->metrics_file());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::StartsWith("train_loss,epoch"));
  CHECK_THAT(text, Catch::Contains("val_loss"));

  {  // the decisions on their own: patience counts validations without improvement
    loom::early_stopping patient({.monitor = "val_accuracy", .patience = 2, .mode = loom::monitor_mode::max});
    CHECK_FALSE(patient.should_stop(0.5));
    CHECK_FALSE(patient.should_stop(0.6));
    CHECK_FALSE(patient.should_stop(0.6));  // no improvement: wait 1
    CHECK(patient.should_stop(0.55));       // wait 2 = patience
    CHECK(patient.best_score() == 0.6);
    loom::early_stopping finite({.monitor = "val_loss"});
    CHECK(finite.should_stop(std::nan("")));
    CHECK_THAT(finite.reason(), Catch::Contains("is not finite"));
  }
}

TEST_CASE("model_checkpoint keeps the top-k by the monitored metric and a last.ckpt; LR monitor logs lr", "[trainer]") {
  scratch_dir dir("trainer-checkpoints");
  loom::model_checkpoint keeper({.monitor = "val_accuracy", .mode = loom::monitor_mode::max, .save_top_k = 2,
                                 .save_last = true});
  auto csv = std::make_shared<loom::csv_logger>(dir.path().string(), loom::csv_logger_options{.name = "run", .version = std::int64_t{0}});
  loom::Fabric<loom::cpu> fabric(
      {.loggers = {csv}, .callbacks = {std::ref(keeper), loom::lr_monitor({.log_momentum = false})}});
  loom::trainer trainer(fabric, quiet({.max_epochs = 4, .checkpoint_frequency = 2, .log_every_n_steps = 2}, dir.path().string()));
  Classifier model;
  const auto result = trainer.fit(model, synthetic(32), synthetic(16, 5), {.train_loader = {.batch_size = 8}});
  CHECK(result.epochs == 4);
  CHECK(keeper.best_k_models().size() == 2);
  for (const auto& [path, score] : keeper.best_k_models()) {
    CHECK(fs::exists(path));
    CHECK(score <= *keeper.best_model_score());
  }
  std::size_t kept = 0;
  for (const auto& entry : fs::directory_iterator(keeper.dirpath())) kept += entry.path().filename() != "last.ckpt";
  CHECK(kept == 2);  // the others it wrote were deleted
  CHECK(fs::exists(keeper.last_model_path()));
  // The trainer's own: every 2 epochs, and on stop (the same file at epoch 4).
  CHECK(fs::exists(loom::checkpoint_file_name(dir.path().string(), 2, 8)));
  CHECK(fs::exists(loom::checkpoint_file_name(dir.path().string(), 4, 16)));
  CHECK(loom::latest_checkpoint(dir.path().string()) == loom::checkpoint_file_name(dir.path().string(), 4, 16));
  csv->save();
  std::ifstream in(csv->metrics_file());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("lr-SGD"));
}

TEST_CASE("fit resumes inside an epoch from a checkpoint: the same weights as a straight run", "[trainer]") {
  // In one process (the multi-process test in tests/dist/trainer.sh resumes in a new process).
  scratch_dir dir("trainer-resume");
  auto fit = [&](const std::string& checkpoints, std::int64_t max_steps, const std::string& resume) {
    at::manual_seed(5);
    Classifier model;
    loom::Fabric<loom::cpu> fabric;
    loom::trainer trainer(fabric, quiet({.max_epochs = 100, .max_steps = max_steps}, checkpoints));
    const auto result = trainer.fit(model, synthetic(50), {.train_loader = {.batch_size = 8, .shuffle = true}, .resume = resume});
    return std::make_pair(flat(*model), result);
  };
  const auto straight = fit(dir.path().string() + "/straight", 20, "");
  const auto first = fit(dir.path().string() + "/split", 10, "");  // 7 batches per epoch: stops at epoch 1, batch 3
  CHECK(first.second.last_checkpoint == loom::checkpoint_file_name(dir.path().string() + "/split", 1, 10));
  const auto second = fit(dir.path().string() + "/split", 20, "last");
  CHECK(second.second.global_step == 20);
  CHECK(at::equal(straight.first, second.first));
  CHECK_THROWS_WITH(fit(dir.path().string() + "/split", 30, dir.path().string() + "/missing.ckpt"), Catch::Contains("missing.ckpt"));
}

TEST_CASE("the trainer refuses options that cannot work, with the reason", "[trainer]") {
  loom::Fabric<loom::cpu> fabric;
  CHECK_THROWS_WITH(loom::trainer(fabric, {.grad_accum_steps = 0}), Catch::Contains("grad_accum_steps must be >= 1"));
  CHECK_THROWS_WITH(loom::trainer(fabric, {.max_epochs = std::nullopt}), Catch::Contains("set max_epochs or max_steps"));
  CHECK_THROWS_WITH(loom::trainer(fabric, {.gradient_clip_val = -1.0}), Catch::Contains("gradient_clip_val must be positive"));
}

// ------------------------------------------------------------ loggers
TEST_CASE("csv_logger.resume drops the rows logged after the restored step and appends", "[loggers]") {
  scratch_dir dir("csv-resume");
  {
    loom::csv_logger first(dir.path().string(), {.name = "run", .version = std::int64_t{0}});
    for (std::int64_t step = 1; step <= 6; ++step) first.log_metrics({{"loss", 1.0 / static_cast<double>(step)}}, step);
    first.log_metrics({{"val_loss", 0.5}}, 6);
    first.save();
  }
  loom::csv_logger second(dir.path().string(), {.name = "run"});
  second.resume(dir.path().string() + "/run/version_0", 4);
  second.log_metrics({{"loss", 0.2}}, 5);
  second.save();
  CHECK(second.log_dir() == dir.path().string() + "/run/version_0");
  std::ifstream in(second.metrics_file());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 6);
  CHECK(lines[0] == "loss,step,val_loss\r");
  CHECK(lines[4] == "0.25,4,\r");
  CHECK(lines[5] == "0.2,5,\r");
}

// The independent reader: tests/read_tensorboard.py (python3-protobuf, its
// own CRC32C), run on the files this test writes.
int run_reader(const std::string& arguments) {
  const auto source = loom::cluster::setting_text("LOOM_SOURCE_DIR");
  REQUIRE(source);
  const std::string command = "/usr/bin/python3 " + *source + "/tests/read_tensorboard.py --proto " + *source +
                              "/src/loggers/proto " + arguments;
  return std::system(command.c_str());
}

TEST_CASE("TensorBoard event files hold every scalar at its step, read back by an independent Python reader",
          "[loggers]") {
  scratch_dir dir("tensorboard");
  CHECK(loom::crc32c("123456789", 9) == 0xE3069283u);  // the CRC-32C check value
  std::ofstream expect(dir.path().string() + "/expect.txt");
  expect << std::setprecision(17);
  {
    loom::tensorboard_logger logger(dir.path().string(), {.name = "run", .version = std::int64_t{0}});
    logger.log_hyperparams({{"lr", 0.001}, {"layers", std::int64_t{3}}, {"optimizer", std::string("adam")}, {"bn", true}});
    for (std::int64_t step = 0; step < 120; step += 7) {
      const double loss = std::exp(-0.03 * static_cast<double>(step));
      logger.log_metrics({{"train_loss", loss}, {"epoch", step / 50}}, step);
      expect << "train_loss " << step << " " << loss << "\n" << "epoch " << step << " " << step / 50 << "\n";
    }
    logger.finalize("success");
    CHECK_THAT(logger.event_file(), Catch::Contains("/run/version_0/events.out.tfevents."));
  }
  expect << "hparam lr 0.001\nhparam layers 3\nhparam optimizer adam\nhparam bn true\n";
  expect.close();
  CHECK(run_reader("--dir " + dir.path().string() + "/run/version_0 --expect " + dir.path().string() + "/expect.txt") == 0);

  // A resumed run: the events after the checkpoint's step are purged, the new ones count.
  {
    loom::tensorboard_logger resumed(dir.path().string(), {.name = "run"});
    resumed.resume(dir.path().string() + "/run/version_0", 56);
    resumed.log_metrics({{"train_loss", 9.5}}, 63);
  }
  std::ofstream after(dir.path().string() + "/expect_resumed.txt");
  after << std::setprecision(17);
  after << "train_loss 56 " << std::exp(-0.03 * 56.0) << "\ntrain_loss 63 9.5\nabsent train_loss 70\n";
  after.close();
  CHECK(run_reader("--dir " + dir.path().string() + "/run/version_0 --expect " + dir.path().string() + "/expect_resumed.txt") == 0);

  // A flipped byte is caught by the reader's CRC check.
  const auto file = dir.path().string() + "/corrupt";
  fs::create_directories(file);
  for (const auto& entry : fs::directory_iterator(dir.path().string() + "/run/version_0")) {
    fs::copy_file(entry.path(), fs::path(file) / entry.path().filename());
  }
  for (const auto& entry : fs::directory_iterator(file)) {
    std::fstream bytes(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    bytes.seekp(40);
    bytes.put('\x7f');
  }
  CHECK(run_reader("--dir " + file + " --expect " + dir.path().string() + "/expect.txt 2>/dev/null") != 0);
}

// ------------------------------------------------------------ FLOPs
struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 4, 5).stride(2)))),
        fc(register_module("fc", torch::nn::Linear(4 * 6 * 6, 10))) {}
  at::Tensor forward(const at::Tensor& x) {
    return fc->forward(torch::relu(conv2->forward(torch::relu(conv1->forward(x)))).flatten(1));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(ConvNet);

struct AttentionImpl : torch::nn::Module {
  AttentionImpl() : proj(register_module("proj", torch::nn::Linear(16, 16))) {}
  // q k^T and p v with functional matmul on [batch, heads, seq, dim].
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor q = proj->forward(x).view({2, 10, 4, 4}).transpose(1, 2);  // [2, 4, 10, 4]
    const at::Tensor scores = at::matmul(q, q.transpose(-2, -1)).softmax(-1);  // [2, 4, 10, 10]
    return at::matmul(scores, q);                                              // [2, 4, 10, 4]
  }
  torch::nn::Linear proj;
};
TORCH_MODULE(Attention);

TEST_CASE("measure_flops equals hand-computed counts: MLP, CNN, functional matmul", "[flops]") {
  SECTION("MLP 784-256-10, batch 32") {
    torch::nn::Sequential mlp(torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10));
    const auto counts = loom::measure_flops(mlp, at::randn({32, 784}));
    const double layer1 = 2.0 * 32 * 784 * 256, layer2 = 2.0 * 32 * 256 * 10;
    CHECK(counts.forward == layer1 + layer2);
    // Backward: layer 2 needs the gradients of its input and weight, layer 1
    // only of its weight (the batch needs no gradient).
    CHECK(counts.backward == 2 * layer2 + layer1);
    CHECK(counts.by_operator.at("aten::addmm") == layer1 + layer2);
  }
  SECTION("CNN: two convolutions (padding, stride) and a linear layer, batch 2") {
    ConvNet net;
    const auto counts = loom::measure_flops(net, at::randn({2, 3, 16, 16}));
    const double conv1 = 2.0 * 2 * (8 * 3 * 3 * 3) * (16 * 16);   // 16x16 out (padding 1)
    const double conv2 = 2.0 * 2 * (4 * 8 * 5 * 5) * (6 * 6);     // (16 - 5) / 2 + 1 = 6
    const double fc = 2.0 * 2 * 144 * 10;
    CHECK(counts.forward == conv1 + conv2 + fc);
    // conv1: weight gradient only; conv2 and fc: input and weight.
    CHECK(counts.backward == conv1 + 2 * conv2 + 2 * fc);
    CHECK(net->conv1->weight.grad().defined() == false);  // gradients put back as they were
  }
  SECTION("functional matmul on 4-D tensors counts as the batched products it runs") {
    Attention net;
    const auto counts = loom::measure_flops(net, at::randn({2, 10, 16}));
    const double proj = 2.0 * 20 * 16 * 16;
    const double qk = 2.0 * (2 * 4) * 10 * 4 * 10, pv = 2.0 * (2 * 4) * 10 * 10 * 4;
    CHECK(counts.forward == proj + qk + pv);
    CHECK(counts.by_operator.at("aten::bmm") > 0);
  }
  SECTION("one counter at a time") {
    loom::flop_counter outer;
    CHECK_THROWS_WITH(loom::flop_counter(), Catch::Contains("one at a time"));
  }
}

// ------------------------------------------------------------ throughput, progress
TEST_CASE("throughput against a fixed clock: Lightning's keys, rolling window, MFU", "[trainer]") {
  loom::throughput meter({.available_flops = 100.0, .world_size = 2, .window_size = 4});
  auto value = [](const loom::metrics& values, const std::string& key) {
    for (const auto& [name, v] : values) {
      if (name == key) return std::holds_alternative<double>(v) ? std::get<double>(v) : static_cast<double>(std::get<std::int64_t>(v));
    }
    FAIL("no key " << key);
    return 0.0;
  };
  // Every 0.5 s one batch of 32 samples (64 items, 10 flops) per device.
  for (int i = 1; i <= 3; ++i) meter.update(0.5 * i, i, 32 * i, 64 * i, 10.0);
  auto partial = meter.compute();
  CHECK(value(partial, "samples") == 96);
  for (const auto& [name, v] : partial) CHECK(name.find("per_sec") == std::string::npos);  // window not full
  for (int i = 4; i <= 6; ++i) meter.update(0.5 * i, i, 32 * i, 64 * i, 10.0);
  const auto full = meter.compute();
  CHECK(value(full, "time") == 3.0);
  CHECK(value(full, "device/batches_per_sec") == Approx(2.0));
  CHECK(value(full, "device/samples_per_sec") == Approx(64.0));
  CHECK(value(full, "device/items_per_sec") == Approx(128.0));
  CHECK(value(full, "batches_per_sec") == Approx(4.0));
  CHECK(value(full, "samples_per_sec") == Approx(128.0));
  CHECK(value(full, "device/flops_per_sec") == Approx(20.0));  // 3 batches of 10 flops in 1.5 s
  CHECK(value(full, "flops_per_sec") == Approx(40.0));
  CHECK(value(full, "device/mfu") == Approx(0.2));
  CHECK_THROWS_WITH(meter.update(2.0, 7, 7, 7), Catch::Contains("time must increase"));
}

TEST_CASE("the progress line: epoch, bar, rate, ETA and values", "[trainer]") {
  loom::progress_snapshot snapshot{.epoch = 1, .max_epochs = 3, .done = 50, .total = 200, .seconds = 2.0,
                                   .done_at_start = 10, .values = {{"loss", 0.123456}, {"lr", 2e-5}}, .bar_width = 10};
  CHECK(loom::format_progress(snapshot) == "Epoch 2/3 [##........] 50/200 25% 20.0 it/s ETA 0:08 loss=0.1235 lr=2.000e-05");
  CHECK(loom::format_duration(3700) == "1:01:40");
  CHECK(loom::format_duration(75) == "1:15");
}

std::string bar_output(bool terminal) {
  std::FILE* stream = std::tmpfile();
  {
    loom::progress_bar bar({.stream = stream, .terminal = terminal, .refresh_seconds = 0, .lines_per_epoch = 4}, true);
    bar.start_epoch(0, 2, 20, 0);
    for (std::int64_t done = 1; done <= 20; ++done) {
      if (bar.due(done)) bar.update(done, {{"loss", 1.0 / static_cast<double>(done)}});
    }
    bar.end_epoch(20, {{"loss", 0.05}});
    bar.message("validation after epoch 1: val_loss=0.1");
  }
  std::rewind(stream);
  std::string text;
  for (int c = std::fgetc(stream); c != EOF; c = std::fgetc(stream)) text.push_back(static_cast<char>(c));
  std::fclose(stream);
  return text;
}

TEST_CASE("the progress bar redraws in place on a terminal and prints plain lines elsewhere", "[trainer]") {
  const std::string terminal = bar_output(true);
  CHECK(std::count(terminal.begin(), terminal.end(), '\r') == 21);  // every update, then the epoch's end
  CHECK_THAT(terminal, Catch::Contains("\033[K"));  // clear to the end of the redrawn line
  CHECK_THAT(terminal, Catch::Contains("[####################] 20/20 100%"));
  CHECK_THAT(terminal, Catch::EndsWith("\nvalidation after epoch 1: val_loss=0.1\n"));
  CHECK(std::count(terminal.begin(), terminal.end(), '\n') == 2);  // the finished bar and the message
  const std::string plain = bar_output(false);
  CHECK(plain.find('\r') == std::string::npos);
  CHECK(std::count(plain.begin(), plain.end(), '\n') == 3 + 1 + 1);  // at 5, 10, 15; the end; the message
  CHECK_THAT(plain, Catch::Contains("Epoch 1/2 [#####...............] 5/20 25%"));
  CHECK_THAT(plain, Catch::Contains("Epoch 1/2 [####################] 20/20 100%"));
}

}  // namespace
