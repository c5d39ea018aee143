// The Fabric API on one device: options and their errors, data loading,
// gradient clipping, callbacks, loggers and the small helpers.
#include "test_models.hpp"

#include "catch.hpp"
#include <loom/environment.hpp>
#include <loom/loom.hpp>
#include <torch/data/datasets/base.h>
#include <torch/data/samplers/sequential.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <fstream>
#include <numeric>
#include <set>

using loom_test::Mlp;

namespace {

// A per-example LibTorch dataset, as users write them: loom stacks its examples.
struct squares : torch::data::datasets::Dataset<squares> {
  torch::data::Example<> get(size_t index) override {
    const auto value = static_cast<double>(index);
    return {at::full({2}, value), at::full({}, value * value)};
  }
  c10::optional<size_t> size() const override { return 10; }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("devices: cpu counts processes, single_device takes one, cuda says LibTorch has no CUDA", "[fabric]") {
  using cpu_fabric = loom::Fabric<loom::cpu, loom::single_device, loom::fp32>;
  CHECK_NOTHROW(cpu_fabric({.devices = 1}));
  CHECK_NOTHROW(cpu_fabric({.devices = "auto"}));
  CHECK_NOTHROW(cpu_fabric({.devices = "1"}));
  CHECK_THROWS_WITH(cpu_fabric({.devices = 2}),
                    Catch::Contains("runs one process on one device") && Catch::Contains("loom::ddp"));
  CHECK_THROWS_WITH(cpu_fabric({.devices = {0, 1}}), Catch::Contains("counted, not selected by index"));
  CHECK_THROWS_WITH(cpu_fabric({.devices = "0,1"}), Catch::Contains("counted, not selected by index"));
  CHECK_THROWS_WITH(cpu_fabric({.devices = 0}), Catch::Contains("must be positive"));
  CHECK_THROWS_WITH(cpu_fabric({.devices = -1}), Catch::Contains("must be positive"));
  CHECK_THROWS_WITH(cpu_fabric({.devices = "two"}), Catch::Contains("not a number") && Catch::Contains("Accepted"));
  CHECK_THROWS_WITH(cpu_fabric({.devices = 1, .num_nodes = 0}), Catch::Contains("num_nodes=0"));

  using cuda_fabric = loom::Fabric<loom::cuda, loom::single_device, loom::fp16_mixed>;
  if (!loom::cuda::built_with_cuda()) {
    CHECK_FALSE(loom::cuda::is_available());
    CHECK(loom::cuda::device_count() == 0);
    CHECK_THROWS_WITH(cuda_fabric({.devices = 1}), Catch::Contains("LibTorch was built without CUDA"));
  }
}

TEST_CASE("cuda device strings follow Lightning's parser", "[fabric]") {
  using loom::detail::parse_cuda_devices;
  CHECK((parse_cuda_devices(2, 4) == std::vector<int>{0, 1}));
  CHECK((parse_cuda_devices(-1, 3) == std::vector<int>{0, 1, 2}));
  CHECK((parse_cuda_devices("-1", 2) == std::vector<int>{0, 1}));
  CHECK((parse_cuda_devices("auto", 2) == std::vector<int>{0, 1}));
  CHECK((parse_cuda_devices("3", 4) == std::vector<int>{0, 1, 2}));
  CHECK((parse_cuda_devices("1,3", 4) == std::vector<int>{1, 3}));
  CHECK(parse_cuda_devices("2,", 4) == std::vector<int>{2});
  CHECK((parse_cuda_devices({3, 0}, 4) == std::vector<int>{3, 0}));
  CHECK_THROWS_WITH(parse_cuda_devices(0, 4), Catch::Contains("selects no device"));
  CHECK_THROWS_WITH(parse_cuda_devices(5, 4), Catch::Contains("asks for 5 devices but this machine has 4"));
  CHECK_THROWS_WITH(parse_cuda_devices("0,7", 4), Catch::Contains("device index 7 does not exist"));
  CHECK_THROWS_WITH(parse_cuda_devices({1, 1}, 4), Catch::Contains("given twice"));
  CHECK_THROWS_WITH(parse_cuda_devices("x", 4), Catch::Contains("not a number or a list of indices"));
}

TEST_CASE("setup_dataloaders builds a loader over a dataset with the sampler's order", "[fabric][data]") {
  loom::Fabric<loom::cpu> fabric;
  const auto inputs = at::arange(20, at::kFloat).reshape({10, 2});
  const auto targets = at::arange(10);
  auto loader = fabric.setup_dataloaders(loom::data::tensor_dataset(inputs, targets),
                                         {.batch_size = 4, .shuffle = true, .seed = 5});
  REQUIRE(loader.size() == std::size_t{3});

  auto epoch_order = [&] {
    std::vector<int64_t> order;
    for (auto& batch : loader) {
      CHECK(batch.data.size(0) == batch.target.size(0));
      CHECK(torch::equal(batch.data, inputs.index_select(0, batch.target)));  // rows stay with their targets
      for (int64_t i = 0; i < batch.target.size(0); ++i) order.push_back(batch.target[i].item<int64_t>());
    }
    return order;
  };
  const auto first = epoch_order();
  CHECK(loader.epoch() == 0);
  const auto second = epoch_order();
  CHECK(loader.epoch() == 1);
  REQUIRE(first.size() == 10);
  CHECK(std::set<int64_t>(first.begin(), first.end()).size() == 10);  // a permutation
  CHECK(first != second);                                                // reshuffled per epoch

  // The order is torch's DistributedSampler order for (seed + epoch).
  loom::data::distributed_sampler reference(10, {.shuffle = true, .seed = 5});
  std::vector<int64_t> expected(reference.indices().begin(), reference.indices().end());
  CHECK(first == expected);

  // drop_last drops the incomplete batch.
  auto dropping = fabric.setup_dataloaders(loom::data::tensor_dataset(inputs, targets),
                                           {.batch_size = 4, .drop_last = true});
  std::size_t batches = 0;
  for (auto& batch : dropping) {
    CHECK(batch.data.size(0) == 4);
    ++batches;
  }
  CHECK(batches == 2);
  CHECK(dropping.size() == std::size_t{2});
}

TEST_CASE("setup_dataloaders stacks a per-example dataset and runs with worker threads", "[fabric][data]") {
  loom::Fabric<loom::cpu> fabric;
  auto loader = fabric.setup_dataloaders(squares{}, {.batch_size = 3, .workers = 2});
  std::vector<double> seen;
  for (auto& batch : loader) {
    REQUIRE(batch.data.dim() == 2);
    for (int64_t i = 0; i < batch.data.size(0); ++i) {
      CHECK(batch.target[i].item<double>() == batch.data[i][0].item<double>() * batch.data[i][0].item<double>());
      seen.push_back(batch.data[i][0].item<double>());
    }
  }
  std::vector<double> expected(10);
  std::iota(expected.begin(), expected.end(), 0.0);
  CHECK(seen == expected);  // no shuffle: dataset order
}

TEST_CASE("a user-built loader is accepted for device moves", "[fabric][data]") {
  loom::Fabric<loom::cpu> fabric;
  auto user_loader = torch::data::make_data_loader(loom::data::tensor_dataset(at::ones({6, 2}), at::zeros({6})),
                                                   torch::data::samplers::SequentialSampler(6), 2);
  auto loader = fabric.setup_dataloaders(std::move(user_loader));
  int batches = 0;
  for (auto& batch : loader) {
    CHECK(batch.data.device() == fabric.device());
    ++batches;
  }
  CHECK(batches == 3);
}

TEST_CASE("clip_gradients clips by norm and by value, and refuses both or neither", "[fabric]") {
  loom::Fabric<loom::cpu> fabric;
  at::manual_seed(0);
  Mlp net(4, 8, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  auto make_gradients = [&] {
    optimizer.zero_grad();
    fabric.backward(model(at::randn({16, 4})).pow(2).sum() * 100);
  };
  auto total_norm = [&] {
    double sum = 0;
    for (const auto& p : net->parameters()) sum += p.grad().pow(2).sum().item<double>();
    return std::sqrt(sum);
  };

  make_gradients();
  const double before = total_norm();
  REQUIRE(before > 1.0);
  auto reported = fabric.clip_gradients(model, optimizer, {.max_norm = 1.0});
  REQUIRE(reported.has_value());
  CHECK(*reported == Approx(before).epsilon(1e-4));
  CHECK(total_norm() == Approx(1.0).epsilon(1e-3));

  make_gradients();
  CHECK_FALSE(fabric.clip_gradients(model, optimizer, {.clip_val = 0.01}).has_value());
  for (const auto& p : net->parameters()) CHECK(p.grad().abs().max().item<double>() <= 0.01 + 1e-7);

  CHECK_THROWS_WITH(fabric.clip_gradients(model, optimizer, {.clip_val = 1.0, .max_norm = 1.0}),
                    Catch::Contains("not both"));
  CHECK_THROWS_WITH(fabric.clip_gradients(model, optimizer, {}), Catch::Contains("give clip_val or max_norm"));

  // A non-finite norm is an error by default, as in Lightning.
  make_gradients();
  net->fc1->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(fabric.clip_gradients(model, optimizer, {.max_norm = 1.0}), Catch::Contains("non-finite"));
}

namespace {
struct recorder {
  std::vector<std::string> events;
  void on_train_start() { events.push_back("train_start"); }
  void on_train_batch_end(const at::Tensor& loss, std::int64_t batch_idx) {
    events.push_back("batch_end " + std::to_string(batch_idx) + " " + std::to_string(loss.item<int>()));
  }
  void on_before_optimizer_step(torch::optim::Optimizer& /*optimizer*/) { events.push_back("before_step"); }
};

// A user's own hook. Declared in a namespace and named qualified by the
// callback, whose member function of the same name would otherwise change the
// meaning of the unqualified name inside the class.
namespace my_hooks {
LOOM_DECLARE_HOOK(on_custom_event, const std::string&);
}

struct custom_listener {
  using loom_hooks = std::tuple<my_hooks::on_custom_event>;
  std::vector<std::string>* log;
  void on_custom_event(const std::string& what) { log->push_back("custom " + what); }
  void on_train_start() { log->push_back("listener train_start"); }
};
}  // namespace

TEST_CASE("callbacks: each registered type gets exactly the hooks it implements, in order", "[fabric][callbacks]") {
  recorder first;
  std::vector<std::string> shared_log;
  loom::Fabric<loom::cpu> fabric({.callbacks = {std::ref(first), custom_listener{&shared_log}}});
  REQUIRE(fabric.callbacks().size() == 2);
  CHECK(fabric.callbacks()[0].hooks().size() == 3);
  CHECK(fabric.callbacks()[1].hooks().size() == 2);
  CHECK(fabric.callbacks()[0].get<recorder>() == &first);

  fabric.call<loom::on_train_start>();
  fabric.call<loom::on_train_batch_end>(at::full({}, 7), 3);
  fabric.call<loom::on_train_epoch_end>(0);  // nobody implements it: nothing runs
  fabric.call<my_hooks::on_custom_event>(std::string("ping"));
  CHECK((first.events == std::vector<std::string>{"train_start", "batch_end 3 7"}));
  CHECK((shared_log == std::vector<std::string>{"listener train_start", "custom ping"}));

  // Added later, called after the earlier ones.
  std::vector<std::string> late;
  fabric.add_callback(custom_listener{&late});
  fabric.call<loom::on_train_start>();
  CHECK(shared_log.back() == "listener train_start");
  CHECK(late == std::vector<std::string>{"listener train_start"});
  CHECK(first.events.back() == "train_start");
}

TEST_CASE("log and log_dict reach the CSV logger in Lightning's metrics.csv layout", "[fabric][loggers]") {
  loom_test::scratch_dir dir("csv");
  loom::Fabric<loom::cpu> fabric({.loggers = {loom::csv_logger(dir.path().string())}});
  auto* csv = fabric.first_logger().get<loom::csv_logger>();
  REQUIRE(csv != nullptr);
  CHECK(csv->log_dir() == (dir.path() / "lightning_logs" / "version_0").string());

  fabric.log("loss", 0.5, 0);
  fabric.log("loss", at::full({}, 0.25), 1);
  fabric.log_dict({{"loss", 0.125}, {"acc", std::int64_t{1}}}, 2);
  fabric.log("lr", 1.0);  // no step: the row number, as Lightning
  for (auto& sink : fabric.loggers()) sink.finalize("success");
  CHECK(read_text(csv->metrics_file()) ==
        "loss,step,acc,lr\r\n"
        "0.5,0,,\r\n"
        "0.25,1,,\r\n"
        "0.125,2,1,\r\n"
        ",3,,1.0\r\n");

  // The next logger under the same root takes the next version.
  loom::csv_logger next(dir.path().string());
  CHECK(next.version() == "1");
  CHECK_THROWS_WITH(fabric.log("bad", at::ones({2})), Catch::Contains("one element"));
}

TEST_CASE("the CSV logger appends while columns stay, rewrites when one is added", "[loggers]") {
  loom_test::scratch_dir dir("csv-append");
  loom::csv_logger csv(dir.path().string(), {.name = "run", .version = std::string("fixed"),
                                             .flush_logs_every_n_steps = 2});
  csv.log_metrics({{"a", 1.5}}, 0);
  csv.log_metrics({{"a", 2.0}}, 1);  // (1 + 1) % 2 == 0: flushed
  CHECK(read_text(csv.metrics_file()) == "a,step\r\n1.5,0\r\n2.0,1\r\n");
  csv.log_metrics({{"a", 1e-7}, {"b", std::int64_t{4}}}, 2);
  csv.save();
  CHECK(read_text(csv.metrics_file()) == "a,step,b\r\n1.5,0,\r\n2.0,1,\r\n1e-07,2,4\r\n");
  CHECK(csv.log_dir() == (dir.path() / "run" / "fixed").string());
  csv.log_hyperparams({{"lr", 0.001}, {"name", std::string("mlp")}, {"layers", std::int64_t{3}}});
  CHECK(read_text(csv.log_dir() + "/hparams.yaml") == "lr: 0.001\nname: 'mlp'\nlayers: 3\n");
}

TEST_CASE("seed_everything seeds torch and exports PL_GLOBAL_SEED", "[fabric]") {
  loom::Fabric<loom::cpu> fabric;
  CHECK(fabric.seed_everything(42) == 42);
  const auto a = at::rand({3});
  fabric.seed_everything(42);
  CHECK(torch::equal(a, at::rand({3})));
  CHECK(loom::cluster::setting_text("PL_GLOBAL_SEED") == "42");
  CHECK(fabric.seed_everything() == 42);  // read back from the environment
  CHECK_THROWS_WITH(fabric.seed_everything(loom::max_seed_value + 1), Catch::Contains("must be from 0"));
}

TEST_CASE("to_device moves tensors inside containers; rank_zero_first and barrier run on one rank", "[fabric]") {
  loom::Fabric<loom::cpu> fabric;
  std::map<std::string, std::vector<at::Tensor>> nested{{"x", {at::ones({1}), at::zeros({2})}}};
  auto moved = fabric.to_device(nested);
  CHECK(moved.at("x").size() == 2);
  CHECK(moved.at("x")[1].device() == fabric.device());
  auto tuple = fabric.to_device(std::make_tuple(at::ones({1}), 3, std::string("keep")));
  CHECK(std::get<1>(tuple) == 3);
  CHECK(std::get<2>(tuple) == "keep");
  {
    auto first = fabric.rank_zero_first();
    fabric.barrier();
  }
  CHECK(torch::equal(fabric.all_reduce(at::ones({2}), loom::reduce_op::mean), at::ones({2})));
  CHECK(fabric.reduce_boolean_decision(true));
  int ran = 0;
  fabric.launch([&](auto& f) { ran = f.world_size(); });
  CHECK(ran == 1);
}

namespace {
// A per-example dataset whose examples carry a random draw (augmentation).
struct noisy : torch::data::datasets::Dataset<noisy> {
  torch::data::Example<> get(size_t index) override {
    return {at::rand({1}, loom::data::worker_generator()), at::full({}, static_cast<int64_t>(index))};
  }
  c10::optional<size_t> size() const override { return 8; }
};

std::vector<float> draws(loom::data::seeded_dataset<noisy> dataset) {
  auto batch = dataset.get_batch(std::vector<size_t>{0, 1, 2});
  std::vector<float> out;
  for (const auto& example : batch) out.push_back(example.data.item<float>());
  return out;
}
}  // namespace

TEST_CASE("loader workers draw from generators of their own, per rank and worker", "[fabric][data]") {
  CHECK(draws({noisy{}, 7, 0}) == draws({noisy{}, 7, 0}));  // reproducible for a (seed, rank)
  CHECK(draws({noisy{}, 7, 0}) != draws({noisy{}, 7, 1}));  // another rank draws another stream
  CHECK(draws({noisy{}, 7, 0}) != draws({noisy{}, 8, 0}));  // and another seed
  // Two workers of one loader: copies of one dataset, numbered on first use.
  loom::data::seeded_dataset<noisy> original(noisy{}, 7, 0);
  auto first = original;
  auto second = original;
  const auto a = draws(first);                     // the copy inside draws() starts first: worker 0
  (void)second.get_batch(std::vector<size_t>{0});  // the next copy to start: worker 1
  CHECK(second.worker() == 1);
  CHECK(a != draws(second));  // worker 1 continues its own stream, not worker 0's
  CHECK(loom::data::worker_seed(7, 0, 0) != loom::data::worker_seed(7, 0, 1));
  CHECK(loom::data::worker_seed(7, 0, 1) != loom::data::worker_seed(7, 1, 0));

  // Through setup_dataloaders with 2 workers: the two workers' draws differ.
  loom::Fabric<loom::cpu> fabric;
  auto loader = fabric.setup_dataloaders(noisy{}, {.batch_size = 1, .workers = 2});
  std::set<float> values;
  for (auto& batch : loader) values.insert(batch.data.item<float>());
  CHECK(values.size() == 8);
}
