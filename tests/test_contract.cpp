// The strategy contract, layer by layer: models written from scratch
// (inheriting nothing from loom) satisfy each layer and train through
// Fabric, every step member is reached through the strategy, joint setup,
// DDP with a world of one, and Lightning's all_gather on one process.
#include "../src/comm/watchdog.hpp"
#include "allocation_counter.hpp"
#include "strategy_models.hpp"
#include "test_models.hpp"

#include "catch.hpp"
#include <loom/loom.hpp>
#include <loom/any_fabric.hpp>
#include <loom/runtime/fabric_model.hpp>
#include <loom/runtime/make_fabric_with_strategy.hpp>
#include <loom/runtime/register_strategy.hpp>
#include <loom/runtime/registry.hpp>
#include <loom/policy_names.hpp>
#include <loom/strategy/fsdp_engine.hpp>  // the engine's units
#include <loom/strategy/fsdp_options.hpp>

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <typeindex>

using models::bare_precision;
using models::bare_strategy;
using models::member;

namespace {
template <member M>
using lacking = bare_strategy<M>;

std::filesystem::path scratch_dir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / (std::string("loom-contract-") + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}
}  // namespace

TEST_CASE("each member belongs to one layer of the strategy contract", "[contract]") {
  // The complete model, inheriting nothing, satisfies every layer.
  STATIC_REQUIRE(loom::StrategyProcesses<bare_strategy<>>);
  STATIC_REQUIRE(loom::StrategyModules<bare_strategy<>>);
  STATIC_REQUIRE(loom::StrategyTraining<bare_strategy<>>);
  STATIC_REQUIRE(loom::StrategyCheckpoints<bare_strategy<>>);
  STATIC_REQUIRE(loom::StrategyCollectives<bare_strategy<>>);
  STATIC_REQUIRE(loom::Strategy<bare_strategy<>>);
  STATIC_REQUIRE(loom::Precision<bare_precision>);

  // A missing member fails its own layer and every layer above it, not the ones below.
  STATIC_REQUIRE_FALSE(loom::StrategyProcesses<lacking<member::setup_environment>>);
  STATIC_REQUIRE_FALSE(loom::StrategyProcesses<lacking<member::ranks>>);
  STATIC_REQUIRE_FALSE(loom::StrategyProcesses<lacking<member::barrier>>);

  STATIC_REQUIRE(loom::StrategyProcesses<lacking<member::module_state>>);
  STATIC_REQUIRE_FALSE(loom::StrategyModules<lacking<member::module_state>>);
  STATIC_REQUIRE_FALSE(loom::StrategyModules<lacking<member::setup_module>>);
  STATIC_REQUIRE_FALSE(loom::StrategyModules<lacking<member::forward>>);
  // Joint setup is part of the contract only where the strategy needs it.
  STATIC_REQUIRE(loom::Strategy<bare_strategy<member::joint_setup, false>>);
  STATIC_REQUIRE_FALSE(loom::StrategyModules<bare_strategy<member::joint_setup, true>>);
  STATIC_REQUIRE(loom::Strategy<bare_strategy<member::none, true>>);

  STATIC_REQUIRE(loom::StrategyModules<lacking<member::backward>>);
  STATIC_REQUIRE_FALSE(loom::StrategyTraining<lacking<member::backward>>);
  STATIC_REQUIRE_FALSE(loom::StrategyTraining<lacking<member::optimizer_step>>);
  STATIC_REQUIRE_FALSE(loom::StrategyTraining<lacking<member::zero_grad>>);
  STATIC_REQUIRE_FALSE(loom::StrategyTraining<lacking<member::clip_gradients>>);
  STATIC_REQUIRE_FALSE(loom::StrategyTraining<lacking<member::no_backward_sync>>);

  STATIC_REQUIRE(loom::StrategyTraining<lacking<member::save_checkpoint>>);
  STATIC_REQUIRE_FALSE(loom::StrategyCheckpoints<lacking<member::save_checkpoint>>);
  STATIC_REQUIRE_FALSE(loom::StrategyCheckpoints<lacking<member::load_checkpoint>>);

  STATIC_REQUIRE(loom::StrategyCheckpoints<lacking<member::all_reduce>>);
  STATIC_REQUIRE_FALSE(loom::StrategyCollectives<lacking<member::all_reduce>>);
  STATIC_REQUIRE_FALSE(loom::StrategyCollectives<lacking<member::all_gather>>);
  STATIC_REQUIRE_FALSE(loom::StrategyCollectives<lacking<member::broadcast>>);
  STATIC_REQUIRE_FALSE(loom::StrategyCollectives<lacking<member::reduce_scatter>>);
  STATIC_REQUIRE_FALSE(loom::StrategyCollectives<lacking<member::reduce_boolean_decision>>);

  // The built-in strategies model the whole contract.
  STATIC_REQUIRE(loom::Strategy<loom::single_device>);
  STATIC_REQUIRE(loom::Strategy<loom::parallel>);
  STATIC_REQUIRE(loom::Strategy<loom::ddp>);
}

TEST_CASE("a strategy and a precision written from scratch train one step, every step through the strategy",
          "[contract]") {
  models::strategy_calls calls;
  bare_strategy<> strategy;
  strategy.calls = &calls;
  loom::Fabric<loom::cpu, bare_strategy<>, bare_precision> fabric({}, strategy);
  // Seeded: the global generator's state here depends on what earlier tests
  // drew (loader threads among them), and a draw whose ReLUs are all off
  // gives a zero gradient and a step that changes nothing (seen once in CI).
  torch::manual_seed(11);
  loom_test::Mlp net(4, 8, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  const at::Tensor before = net->parameters()[0].clone();

  optimizer.zero_grad();
  const at::Tensor loss = model(at::ones({3, 4})).pow(2).sum();
  fabric.backward(loss);
  const auto norm = fabric.clip_gradients(model, optimizer, {.max_norm = 1e6});
  optimizer.step();
  {
    auto guard = fabric.no_backward_sync(model);
  }
  CHECK(norm.has_value());
  CHECK_FALSE(torch::equal(before, net->parameters()[0]));
  CHECK(fabric.precision().backwards == 1);
  CHECK(fabric.precision().steps == 1);
  for (const char* step : {"setup_module", "forward", "backward", "clip_gradients", "optimizer_step", "zero_grad",
                           "no_backward_sync"}) {
    INFO(step);
    CHECK(calls.count[step] == 1);
  }

  // Checkpoints go through the strategy too, and round-trip.
  const auto path = (scratch_dir("bare") / "bare.ckpt").string();
  fabric.save(path, {{"model", model}});
  const at::Tensor saved = net->parameters()[0].clone();
  {
    at::NoGradGuard no_grad;
    net->parameters()[0].zero_();
  }
  fabric.load(path, {{"model", model}});
  CHECK(torch::equal(saved, net->parameters()[0]));
  CHECK(calls.count["save_checkpoint"] == 1);
  CHECK(calls.count["load_checkpoint"] == 1);
  CHECK(torch::equal(fabric.all_reduce(at::ones({2})), at::ones({2})));
  CHECK(calls.count["all_reduce"] == 1);
}

TEST_CASE("a strategy that needs joint setup gets the module with its optimizers, static and erased",
          "[contract]") {
  using joint = bare_strategy<member::none, true>;
  STATIC_REQUIRE(loom::needs_joint_setup<joint>);
  models::strategy_calls calls;
  joint strategy;
  strategy.calls = &calls;
  {
    loom::Fabric<loom::cpu, joint, loom::fp32> fabric({}, strategy);
    loom_test::Mlp net(4, 8, 2);
    torch::optim::SGD first(net->parameters(), 0.1);
    torch::optim::SGD second(net->parameters(), 0.1);
    auto [model, optimizer_a, optimizer_b] = fabric.setup(net, first, second);
    CHECK(calls.count["setup_module_and_optimizers"] == 1);
    CHECK(calls.count["setup_module"] == 0);
    REQUIRE(calls.jointly_set_up.size() == 2);
    CHECK(calls.jointly_set_up[0] == &first);
    CHECK(calls.jointly_set_up[1] == &second);
    optimizer_a.zero_grad();
    fabric.backward(model(at::ones({2, 4})).sum());
    optimizer_a.step();
    CHECK(calls.count["optimizer_step"] == 1);
  }
  // The erased form asks the same strategy through the same path.
  calls = {};
  loom::AnyFabric erased(std::make_unique<loom::runtime::fabric_model<loom::cpu, joint, loom::fp32>>(
                             "joint", loom::fabric_options{}, strategy),
                         {}, {});
  loom_test::Mlp net(4, 8, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  CHECK_THROWS_WITH(erased.setup_module(net), Catch::Contains("sets up the module and its optimizers together"));
  CHECK_THROWS_WITH(erased.setup_optimizers(sgd), Catch::Contains("sets up the module and its optimizers together"));
  auto [model, optimizer] = erased.setup(net, sgd);
  CHECK(calls.count["setup_module_and_optimizers"] == 1);
  REQUIRE(calls.jointly_set_up.size() == 1);
  CHECK(calls.jointly_set_up[0] == &sgd);
  optimizer.zero_grad();
  erased.backward(model(at::ones({2, 4})).sum());
  CHECK(erased.clip_gradients(model, optimizer, {.max_norm = 1e6}).has_value());
  optimizer.step();
  CHECK(calls.count["backward"] == 1);
  CHECK(calls.count["clip_gradients"] == 1);
  CHECK(calls.count["optimizer_step"] == 1);
}

TEST_CASE("ddp with a world of one trains without a launcher, as single_device does", "[contract]") {
  loom::Fabric<loom::cpu, loom::ddp, loom::fp32> ddp_fabric;
  loom::Fabric<loom::cpu, loom::single_device, loom::fp32> single_fabric;
  CHECK(ddp_fabric.world_size() == 1);
  torch::manual_seed(3);
  loom_test::Mlp ddp_net(4, 8, 2);
  loom_test::Mlp single_net(4, 8, 2);
  {
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < ddp_net->parameters().size(); ++i) {
      single_net->parameters()[i].copy_(ddp_net->parameters()[i]);
    }
  }
  torch::optim::SGD ddp_sgd(ddp_net->parameters(), 0.1);
  torch::optim::SGD single_sgd(single_net->parameters(), 0.1);
  auto [ddp_model, ddp_optimizer] = ddp_fabric.setup(ddp_net, ddp_sgd);
  auto [single_model, single_optimizer] = single_fabric.setup(single_net, single_sgd);
  const at::Tensor input = at::randn({6, 4});
  for (int step = 0; step < 3; ++step) {
    ddp_optimizer.zero_grad();
    ddp_fabric.backward(ddp_model(input).pow(2).sum());
    ddp_optimizer.step();
    single_optimizer.zero_grad();
    single_fabric.backward(single_model(input).pow(2).sum());
    single_optimizer.step();
  }
  for (std::size_t i = 0; i < ddp_net->parameters().size(); ++i) {
    CHECK(torch::equal(ddp_net->parameters()[i], single_net->parameters()[i]));
  }
  {
    auto guard = ddp_fabric.no_backward_sync(ddp_model);
  }
  CHECK(ddp_fabric.strategy().gradient_collectives() == 0);
}

namespace {
// An accelerator written here and nowhere else: the host under another name.
// Its header is all an accelerator needs for the static Fabric (the
// run-time registry would add its source's line).
struct host_accelerator {
  using loom_concept = loom::accelerator_tag;
  static constexpr std::string_view name = "host";
  static constexpr c10::DeviceType device_type = c10::DeviceType::CPU;
  static constexpr bool supports_fp16_compute = false;
  static bool is_available() { return true; }
  static int device_count() { return 1; }
  static loom::device_selection parse_devices(const loom::devices_spec& devices) {
    return loom::cpu::parse_devices(devices);
  }
  static c10::Device device(const loom::device_selection& /*selection*/, int /*local_rank*/) {
    return c10::Device(c10::DeviceType::CPU);
  }
};

// Three SGD steps of the same model under Fabric F; its parameters after.
template <class F>
std::vector<at::Tensor> three_steps(F& fabric) {
  torch::manual_seed(5);
  loom_test::Mlp net(4, 8, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  const at::Tensor input = at::randn({6, 4});
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    fabric.backward(model(input).pow(2).sum());
    optimizer.step();
  }
  return net->parameters();
}
}  // namespace

namespace {
// A sharded strategy written here and nowhere else: the sharding engine over
// the world with SHARD_GRAD_OP (parameters whole between steps, gradients
// reduce-scattered), saving sharded only. Its module setup and save are all
// it writes; forward, no_backward_sync, clip_gradients, counters and the
// in-place load are sharded_parallel's.
struct grad_op_sharded : loom::sharded_parallel {
  static constexpr std::string_view name = "test_grad_op_sharded";
  static constexpr bool supports_no_backward_sync = true;

  module_state setup_module(torch::nn::Module& module, bool move_to_device = true) {
    loom::comm::process_group& world = group();
    if (move_to_device) module.to(device_);
    return add_engine(module, world, loom::fsdp_options{.strategy = loom::sharding_strategy::shard_grad_op});
  }
  void save_checkpoint(const std::string& path, const loom::state& checkpoint, const loom::state_filter& filter,
                       const loom::checkpoint_metadata& metadata) {
    save_full_or_sharded(/*full=*/false, name, "use fsdp", path, checkpoint, filter, metadata);
  }
};
static_assert(loom::Strategy<grad_op_sharded>);
}  // namespace

TEST_CASE("a sharded strategy defined in a test alone trains as single_device and round-trips its sharded save",
          "[contract]") {
  loom::Fabric<loom::cpu, grad_op_sharded, loom::fp32> sharded;
  loom::Fabric<loom::cpu, loom::single_device, loom::fp32> single;
  const std::vector<at::Tensor> trained = three_steps(sharded);
  const std::vector<at::Tensor> expected = three_steps(single);
  REQUIRE(trained.size() == expected.size());
  for (std::size_t i = 0; i < trained.size(); ++i) CHECK(torch::allclose(trained[i], expected[i], 0, 1e-6));

  torch::manual_seed(6);
  loom_test::Mlp net(4, 8, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = sharded.setup(net, sgd);
  // The module is the sharding engine's: one unit (the root), on a world of
  // one (where it sends nothing: the counters stay 0).
  REQUIRE(model.session().state() != nullptr);
  CHECK(model.session().state()->units().size() == 1);
  CHECK(model.session().state()->shard_size() == 1);
  const auto path = (scratch_dir("sharded") / "sharded.ckpt").string();
  sharded.save(path, {{"model", model}});
  CHECK(std::filesystem::is_directory(path));  // a sharded save: each rank's file and meta.pt
  const at::Tensor saved = net->parameters()[0].clone();
  {
    at::NoGradGuard no_grad;
    for (auto& parameter : net->parameters()) parameter.zero_();
  }
  sharded.load(path, {{"model", model}});
  CHECK(torch::equal(saved, net->parameters()[0]));
  const loom::state_filter keep_all{{"model", [](std::string_view, const at::Tensor&) { return true; }}};
  CHECK_THROWS_WITH(sharded.save(path, {{"model", model}}, keep_all),
                    Catch::Contains("test_grad_op_sharded: a filter is refused for sharded saves"));
}

// deepspeed sets a module up only with its optimizer: it has no setup_module
// (it inherited fsdp's), and the concept does not ask a joint-setup strategy for one.
static_assert(!loom::detail::strategy_members::setup_module<loom::deepspeed>);
static_assert(loom::detail::strategy_members::setup_module<loom::fsdp>);
static_assert(loom::Strategy<loom::deepspeed>);

TEST_CASE("an accelerator defined in a test alone: the compatibility rules read its device type, and it trains as cpu",
          "[contract]") {
  STATIC_REQUIRE(loom::Accelerator<host_accelerator>);
  STATIC_REQUIRE(loom::accelerator_facts_of<host_accelerator>().device == loom::rules::device_type::cpu);
  STATIC_REQUIRE(loom::compatible<host_accelerator, loom::ddp, loom::bf16_mixed>);
  STATIC_REQUIRE(loom::compatible<host_accelerator, loom::fsdp, loom::fp32>);
  STATIC_REQUIRE_FALSE(loom::compatible<host_accelerator, loom::dp, loom::fp32>);  // dp runs_on {cuda}
  STATIC_REQUIRE_FALSE(loom::compatible<host_accelerator, loom::single_device, loom::fp16>);
  loom::Fabric<host_accelerator, loom::ddp, loom::bf16_mixed> host;
  loom::Fabric<loom::cpu, loom::ddp, loom::bf16_mixed> cpu;
  CHECK(host.device() == cpu.device());
  const auto on_host = three_steps(host);
  const auto on_cpu = three_steps(cpu);
  REQUIRE(on_host.size() == on_cpu.size());
  for (std::size_t i = 0; i < on_host.size(); ++i) CHECK(torch::equal(on_host[i], on_cpu[i]));
}

TEST_CASE("a strategy's engine registry visits the live engines and drops the dead as new ones come", "[contract]") {
  loom::detail::live_engines<int> engines;
  auto first = std::make_shared<int>(1);
  auto second = std::make_shared<int>(10);
  engines.add(first);
  engines.add(second);
  second.reset();  // its module went away
  int sum = 0;
  engines.for_each([&](int& value) { sum += value; });
  CHECK(sum == 1);
  for (int epoch = 0; epoch < 5; ++epoch) engines.add(std::make_shared<int>(100));  // a module per epoch, each gone
  CHECK(engines.entry_count() == 2);  // first, and the last one added
  sum = 0;
  engines.for_each([&](int& value) { sum += value; });
  CHECK(sum == 1);
}

TEST_CASE("all_gather adds no dimension on one process, as Lightning; all_gather_per_rank gives one tensor",
          "[contract]") {
  const at::Tensor value = at::arange(6, at::kFloat).reshape({2, 3});
  loom::Fabric<loom::cpu, loom::single_device, loom::fp32> single;
  CHECK((single.all_gather(value).sizes() == value.sizes()));
  CHECK(torch::equal(single.all_gather(value), value));
  CHECK(single.all_gather_per_rank(value).size() == 1);
  loom::Fabric<loom::cpu, loom::parallel, loom::fp32> parallel;
  CHECK(torch::equal(parallel.all_gather(value), value));
  CHECK(torch::equal(parallel.all_gather(value, /*sync_grads=*/true), value));
  CHECK(parallel.all_gather_per_rank(value).size() == 1);
  auto erased = loom::make_fabric({.strategy = "ddp"});
  CHECK(torch::equal(erased.all_gather(value), value));
}

TEST_CASE("make_fabric passes a strategy's options (JSON text or file) and refuses what the strategy does not take",
          "[contract][runtime]") {
  using ddp_fabric = loom::Fabric<loom::cpu, loom::ddp, loom::fp32>;
  auto fabric = loom::make_fabric(
      {.strategy = "ddp", .strategy_options = R"({"bucket_cap_mb": 50, "find_unused_parameters": true, "timeout": 90})"});
  REQUIRE(fabric.target<ddp_fabric>() != nullptr);
  const auto& options = fabric.target<ddp_fabric>()->strategy().options();
  CHECK(options.bucket_cap_mb == 50.0);
  CHECK(options.find_unused_parameters);
  CHECK(options.process.timeout == std::chrono::seconds(90));
  CHECK(options.process.launcher == loom::launcher_kind::subprocess);

  // A preset's parameters come first, the user's options over them.
  auto preset = loom::make_fabric({.strategy = "ddp_find_unused_parameters_true",
                                   .strategy_options = R"({"static_graph": true})"});
  CHECK(preset.target<ddp_fabric>()->strategy().options().find_unused_parameters);
  CHECK(preset.target<ddp_fabric>()->strategy().options().static_graph);
  // The launcher is an option of the one ddp type: ddp_fork is a preset.
  auto fork = loom::make_fabric({.strategy = "ddp_fork"});
  REQUIRE(fork.target<ddp_fabric>() != nullptr);
  CHECK(fork.target<ddp_fabric>()->strategy().parallel_settings().launcher == loom::launcher_kind::fork);

  // A file holding the object.
  const auto path = scratch_dir("options") / "ddp.json";
  std::ofstream(path) << R"({"gradient_as_bucket_view": true, "process_group_backend": "gloo"})";
  auto from_file = loom::make_fabric({.strategy = "ddp", .strategy_options = path.string()});
  CHECK(from_file.target<ddp_fabric>()->strategy().options().gradient_as_bucket_view);

  // Errors name the strategy, the key, the value and what is accepted.
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"bucket_cap": 50})"}),
                    Catch::Contains("strategy 'ddp': unknown option 'bucket_cap' = 50; accepted: timeout, "
                                    "collective_timeout, process_group_backend, find_unused_parameters"));
  // The watchdog's collective_timeout, in seconds as timeout.
  auto watched = loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"collective_timeout": 2.5})"});
  CHECK(watched.target<ddp_fabric>()->strategy().parallel_settings().collective_timeout ==
        std::chrono::milliseconds(2500));
  // 0 turns the watchdog off (docs/configuration.md); it was refused as "expected a number > 0".
  auto unwatched = loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"collective_timeout": 0})"});
  CHECK(unwatched.target<ddp_fabric>()->strategy().parallel_settings().collective_timeout ==
        std::chrono::milliseconds(0));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"collective_timeout": -1})"}),
                    Catch::Contains("option 'collective_timeout' = -1 is not accepted: expected a number of seconds "
                                    ">= 0 (0: the watchdog off)"));
  // The rendezvous timeout has no off: 0 stays refused.
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"timeout": 0})"}),
                    Catch::Contains("option 'timeout' = 0 is not accepted: expected a number of seconds > 0"));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"bucket_cap_mb": "big"})"}),
                    Catch::Contains("option 'bucket_cap_mb' = \"big\" is not accepted: expected a number > 0"));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"bucket_cap_mb": -1})"}),
                    Catch::Contains("option 'bucket_cap_mb' = -1 is not accepted"));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"static_graph": 1})"}),
                    Catch::Contains("option 'static_graph' = 1 is not accepted: expected true or false"));
  CHECK_THROWS_WITH(
      loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"process_group_backend": "ucc"})"}),
      Catch::Contains("option 'process_group_backend' = \"ucc\" is not accepted: expected one of \"gloo\", \"nccl\", "
                      "\"mpi\""));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "single_device", .strategy_options = R"({"x": 1})"}),
                    Catch::Contains("unknown option 'x' = 1; accepted: none (it takes no options)"));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"bucket_cap_mb": )"}),
                    Catch::Contains("is not valid JSON"));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = "/nonexistent/ddp.json"}),
                    Catch::Contains("neither a JSON object ('{...}') nor a readable file: '/nonexistent/ddp.json'"));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = R"({"bucket_cap_mb": 1, "bucket_cap_mb": 2})"}),
                    Catch::Contains("strategy 'ddp': the strategy options gives the key 'bucket_cap_mb' twice"));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = "/dev/zero"}),
                    Catch::Contains("strategy options file /dev/zero: it is a character device, not a regular file"));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "ddp", .strategy_options = "[1, 2]"}),
                    Catch::Contains("neither a JSON object"));
}

TEST_CASE("every distributed strategy takes the one process_options as `process`, and its processes run on them",
          "[contract][runtime]") {
  const loom::process_options process{.timeout = std::chrono::seconds(42),
                                      .backend = loom::comm::backend::mpi,
                                      .launcher = loom::launcher_kind::fork,
                                      .mpi_communicator = 7,
                                      .collective_timeout = std::chrono::seconds(9)};
  CHECK(loom::parallel(process).parallel_settings() == process);
  CHECK(loom::ddp(loom::ddp_options{.process = process}).parallel_settings() == process);
  CHECK(loom::fsdp(loom::fsdp_options{.process = process}).parallel_settings() == process);
  CHECK(loom::deepspeed(loom::deepspeed_options{.process = process}).parallel_settings() == process);
  CHECK(loom::deepspeed_stage_3(loom::deepspeed_options{.process = process}).parallel_settings() == process);
  CHECK(loom::model_parallel(loom::model_parallel_options{.process = process}).parallel_settings() == process);

  // The registry reads them under Lightning's names, the same for each family.
  const char* lightning = R"({"timeout": 42, "collective_timeout": 9, "process_group_backend": "mpi"})";
  loom::process_options read = process;
  read.launcher = loom::launcher_kind::subprocess;  // a preset's (ddp_fork), not an option
  read.mpi_communicator.reset();                    // an MPI_Comm, C++ only
  using fp32_fabric = loom::Fabric<loom::cpu, loom::fsdp, loom::fp32>;
  CHECK(loom::make_fabric({.strategy = "fsdp", .strategy_options = lightning})
            .target<fp32_fabric>()->strategy().parallel_settings() == read);
  using zero_fabric = loom::Fabric<loom::cpu, loom::deepspeed, loom::fp32>;
  CHECK(loom::make_fabric({.strategy = "deepspeed", .strategy_options = lightning})
            .target<zero_fabric>()->strategy().parallel_settings() == read);
  using ddp_fabric = loom::Fabric<loom::cpu, loom::ddp, loom::fp32>;
  read.launcher = loom::launcher_kind::fork;
  CHECK(loom::make_fabric({.strategy = "ddp_fork", .strategy_options = lightning})
            .target<ddp_fabric>()->strategy().parallel_settings() == read);
}

TEST_CASE("auto_wrap_policy::types takes a module's holder as Lightning's {nn.Linear}, or its class", "[contract]") {
  // types<torch::nn::Linear>() recorded the holder's type, which no module
  // found at setup has, so it wrapped nothing, silently.
  const auto by_holder = loom::auto_wrap_policy::types<torch::nn::Linear, torch::nn::Conv2d>();
  const auto by_class = loom::auto_wrap_policy::types<torch::nn::LinearImpl, torch::nn::Conv2dImpl>();
  CHECK((by_holder.module_types == by_class.module_types));
  CHECK(by_holder.module_types.count(std::type_index(typeid(torch::nn::LinearImpl))) == 1);
  CHECK(by_holder.module_types.count(std::type_index(typeid(torch::nn::Linear))) == 0);
}

TEST_CASE("LOOM_COLLECTIVE_TIMEOUT: seconds through the one parser, a bad value refused naming it", "[contract]") {
  using loom::comm::effective_collective_timeout;
  const std::chrono::milliseconds configured(300'000);
  struct restore {
    ~restore() { ::unsetenv("LOOM_COLLECTIVE_TIMEOUT"); }
  } restore_after;
  ::unsetenv("LOOM_COLLECTIVE_TIMEOUT");
  CHECK(effective_collective_timeout(configured) == configured);
  ::setenv("LOOM_COLLECTIVE_TIMEOUT", "2.5", 1);
  CHECK(effective_collective_timeout(configured) == std::chrono::milliseconds(2500));
  ::setenv("LOOM_COLLECTIVE_TIMEOUT", "0", 1);  // the watchdog off
  CHECK(effective_collective_timeout(configured) == std::chrono::milliseconds(0));
  // strtod read these before: 1e300 overflowed the cast, "3 s" was read as 3 and "x" ignored.
  for (const char* bad : {"1e300", "3 s", "x", "-1", "inf"}) {
    INFO(bad);
    ::setenv("LOOM_COLLECTIVE_TIMEOUT", bad, 1);
    CHECK_THROWS_WITH(effective_collective_timeout(configured),
                      Catch::Contains(std::string("LOOM_COLLECTIVE_TIMEOUT='") + bad + "' is not accepted"));
  }
}

TEST_CASE("the compatibility rules see the same facts from the types as from the names", "[contract][runtime]") {
  // Fabric reads the facts from the policy types, the connector (and
  // loom-run) from the built-in names: the two must agree for every built-in.
  auto same_accelerator = [](loom::rules::accelerator_facts a, loom::rules::accelerator_facts b) {
    return a.name == b.name && a.device == b.device && a.fp16_compute == b.fp16_compute;
  };
  auto same_precision = [](loom::rules::precision_facts a, loom::rules::precision_facts b) {
    return a.name == b.name && a.fp16 == b.fp16 && a.mixed == b.mixed;
  };
  // Every line of builtin_accelerators.def: the type's facts are the line's,
  // loom-run accepts its name, and the registry holds it when compiled in.
  std::set<std::string> registered;
  for (const auto& entry : loom::runtime::registry::instance().entries()) registered.insert(entry.accelerator);
  const auto& names = loom::accelerator_names();
#define LOOM_ACCELERATOR(type, device, fp16_compute)                                                      \
  STATIC_REQUIRE(                                                                                         \
      same_accelerator(loom::accelerator_facts_of<loom::type>(), loom::rules::builtin_accelerator(#type))); \
  CHECK(std::find(names.begin(), names.end(), #type) != names.end());                                     \
  CHECK(registered.contains(#type) == loom::runtime::compiled_in<loom::type>);
#include <loom/builtin_accelerators.def>
#undef LOOM_ACCELERATOR
  STATIC_REQUIRE(same_precision(loom::precision_facts_of<loom::fp32>(), loom::rules::builtin_precision("32-true")));
  STATIC_REQUIRE(same_precision(loom::precision_facts_of<loom::fp64>(), loom::rules::builtin_precision("64-true")));
  STATIC_REQUIRE(same_precision(loom::precision_facts_of<loom::fp16>(), loom::rules::builtin_precision("16-true")));
  STATIC_REQUIRE(same_precision(loom::precision_facts_of<loom::bf16>(), loom::rules::builtin_precision("bf16-true")));
  STATIC_REQUIRE(same_precision(loom::precision_facts_of<loom::fp16_mixed>(),
                                loom::rules::builtin_precision("16-mixed")));
  STATIC_REQUIRE(same_precision(loom::precision_facts_of<loom::bf16_mixed>(),
                                loom::rules::builtin_precision("bf16-mixed")));
  // The strategies' facts in the registry are their types' traits.
  for (const auto& entry : loom::runtime::registry::instance().entries()) {
    INFO(entry.strategy);
    CHECK(entry.multi_process == (entry.strategy_type != "loom::single_device"));
  }
  // One sentence per rule, used by the static_asserts and the connector alike.
  CHECK_THROWS_WITH(loom::make_fabric({.precision = "16-true"}),
                    Catch::Contains(std::string(loom::rules::reason(loom::rules::rule::fp16_true_without_kernels))));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "single_device", .devices = 2}),
                    Catch::Contains(std::string(loom::rules::reason(loom::rules::rule::one_process))));
}

TEST_CASE("make_fabric takes a ready strategy object, as Lightning's Fabric(strategy=DDPStrategy(...))",
          "[contract][runtime]") {
  auto fabric = loom::make_fabric({.precision = "bf16-mixed"}, loom::ddp(loom::ddp_options{.bucket_cap_mb = 7}));
  using expected = loom::Fabric<loom::cpu, loom::ddp, loom::bf16_mixed>;
  REQUIRE(fabric.target<expected>() != nullptr);
  CHECK(fabric.target<expected>()->strategy().options().bucket_cap_mb == 7.0);
  CHECK(fabric.strategy_name() == "ddp");

  // A strategy no registry knows: the connector reads its facts from the type.
  models::strategy_calls calls;
  bare_strategy<> strategy;
  strategy.calls = &calls;
  auto bare = loom::make_fabric({}, strategy);
  REQUIRE(bare.target<loom::Fabric<loom::cpu, bare_strategy<>, loom::fp32>>() != nullptr);
  loom_test::Mlp net(4, 8, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = bare.setup(net, sgd);
  bare.backward(model(at::ones({2, 4})).sum());
  optimizer.step();
  CHECK(calls.count["backward"] == 1);
  CHECK(calls.count["optimizer_step"] == 1);

  // The same rules as for names; the object's options are its own.
  CHECK_THROWS_WITH(loom::make_fabric({.devices = 2}, bare_strategy<>{}),
                    Catch::Contains(std::string(loom::rules::reason(loom::rules::rule::one_process))));
  CHECK_THROWS_WITH(loom::make_fabric({.precision = "16-true"}, loom::ddp{}),
                    Catch::Contains(std::string(loom::rules::reason(loom::rules::rule::fp16_true_without_kernels))));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy_options = R"({"bucket_cap_mb": 1})"}, loom::ddp{}),
                    Catch::Contains("the strategy object carries its own options"));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "single_device"}, loom::ddp{}),
                    Catch::Contains("config.strategy is 'single_device' but the strategy object is a 'ddp'"));
}

// The collective watchdog's recorder (src/comm/collective_recorder.hpp): the
// hot path writes a ring slot, allocates nothing, and what the watchdog reads
// back (and sends to the other ranks) describes the op, dtype and shape.
TEST_CASE("the collective recorder keeps the last entries, allocates nothing, and its records round-trip",
          "[contract]") {
  using loom::comm::collective_kind;
  loom::comm::collective_recorder recorder;
  const at::Tensor grads = at::zeros({3, 5});
  const at::Tensor index = at::zeros({7}, at::kLong);
  const loom::comm::traffic traffic_before = loom::comm::traffic_so_far();
  recorder.record(collective_kind::broadcast, &index, loom::comm::bytes_of(index));
  const unsigned long long before = loom_test::allocation_count();
  for (int i = 0; i < 1000; ++i) recorder.record(collective_kind::all_reduce, &grads, loom::comm::bytes_of(grads));
  recorder.record(collective_kind::barrier, nullptr, std::uint64_t{0});
  recorder.record(collective_kind::all_to_all, &grads, loom::comm::bytes_of(grads), /*compare_shape=*/false);
  CHECK(loom_test::allocation_count() == before);
  CHECK(recorder.entered() == 1003);
  // Each record is this process's traffic too (loom/comm/traffic.hpp), by kind.
  const loom::comm::traffic traffic = loom::comm::traffic_so_far() - traffic_before;
  CHECK(traffic[collective_kind::broadcast].payload_bytes == 7 * 8);
  CHECK(traffic[collective_kind::all_reduce].collectives == 1000);
  CHECK(traffic[collective_kind::all_reduce].payload_bytes == 1000 * 15 * 4);
  CHECK(traffic[collective_kind::barrier].collectives == 1);
  CHECK(traffic[collective_kind::barrier].payload_bytes == 0);
  CHECK(traffic.total().collectives == 1003);
  CHECK(traffic.total().payload_bytes == 7 * 8 + 1000 * 15 * 4 + 15 * 4);
  // The ring holds the last `capacity` entries; older ones read as gone.
  CHECK_FALSE(recorder.at(0).has_value());
  REQUIRE(recorder.at(1002).has_value());
  CHECK(recorder.at(1000)->describe() == "all_reduce(Float[3, 5])");
  CHECK(recorder.at(1001)->describe() == "barrier");
  CHECK(recorder.at(1002)->describe() == "all_to_all(Float)");
  const auto recent = recorder.recent(3);
  REQUIRE(recent.size() == 3);
  CHECK(recent.front().sequence == 1000);
  // Same op and dtype with the shape left out matches any shape; a different
  // op, dtype or shape does not.
  loom::comm::collective_recorder other;
  other.record(loom::comm::collective_kind::all_to_all, &index, loom::comm::bytes_of(index), false);
  other.record(loom::comm::collective_kind::all_reduce, &index, loom::comm::bytes_of(index));
  other.record(loom::comm::collective_kind::broadcast, &grads, loom::comm::bytes_of(grads));
  CHECK(recorder.at(1002)->matches(*recorder.at(1002)));
  CHECK_FALSE(recorder.at(1002)->matches(*other.at(0)));  // dtype differs
  CHECK_FALSE(recorder.at(1000)->matches(*other.at(2)));  // op differs
  CHECK_FALSE(other.at(1)->matches(*recorder.at(1000)));  // shape and dtype differ

  loom::comm::group_watch group;
  group.recorder = std::make_shared<loom::comm::collective_recorder>();
  group.recorder->record(loom::comm::collective_kind::reduce_scatter, &grads, loom::comm::bytes_of(grads));
  group.recorder->record(loom::comm::collective_kind::all_gather, &index, loom::comm::bytes_of(index));
  group.heartbeat = 41;
  const auto decoded = loom::comm::decode_record(loom::comm::encode_record(group, /*paused=*/true));
  REQUIRE(decoded.has_value());
  CHECK(decoded->entered == 2);
  CHECK(decoded->paused);
  CHECK(decoded->heartbeat == 41);
  REQUIRE(decoded->entries.size() == 2);
  CHECK(decoded->entries[0].describe() == "reduce_scatter(Float[3, 5])");
  CHECK(decoded->entries[1].describe() == "all_gather(Long[7])");
  CHECK_FALSE(loom::comm::decode_record("something else").has_value());
  CHECK_FALSE(loom::comm::decode_record("loom-watchdog-1 2 0\n").has_value());  // no heartbeat: another loom
}

// Communication time (loom/comm/traffic.hpp): off, a record owes nothing;
// on, the clock runs while any collective is open, overlaps count once, and
// it stops when the last one completes.
TEST_CASE("communication time is the union of the intervals collectives are in flight", "[contract]") {
  using loom::comm::collective_kind;
  using clock_type = std::chrono::steady_clock;
  const auto ns = [](clock_type::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  };
  const auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(15)); };
  loom::comm::collective_recorder recorder;
  const at::Tensor grads = at::zeros({4});
  CHECK_FALSE(recorder.record(collective_kind::all_reduce, &grads, std::uint64_t{16}));
  loom::comm::time_collectives(true);
  const loom::comm::traffic before = loom::comm::traffic_so_far();
  const auto opened = clock_type::now();
  const bool first = recorder.record(collective_kind::all_reduce, &grads, std::uint64_t{16});
  const auto first_in = clock_type::now();
  pause();
  const bool second = recorder.record(collective_kind::all_gather, &grads, std::uint64_t{16});  // overlaps the first
  pause();
  if (first) loom::comm::collective_completed();
  pause();
  const auto last_out = clock_type::now();
  if (second) loom::comm::collective_completed();
  const auto closed = clock_type::now();
  loom::comm::time_collectives(false);
  REQUIRE(first);
  REQUIRE(second);
  const std::int64_t busy = (loom::comm::traffic_so_far() - before).in_flight_ns;
  // Within the union's bounds: not the two intervals' sum (about 1.5 times it).
  CHECK(busy >= ns(last_out - first_in));
  CHECK(busy <= ns(closed - opened));
  // Nothing open: the clock stands still.
  const loom::comm::traffic idle = loom::comm::traffic_so_far();
  pause();
  CHECK(loom::comm::traffic_so_far().in_flight_ns == idle.in_flight_ns);
  // A timed collective that ends in scope (loom's synchronous emulations).
  loom::comm::time_collectives(true);
  {
    const loom::comm::timed_collective timing(recorder.record(collective_kind::reduce_scatter, &grads, std::uint64_t{16}));
    pause();
  }
  loom::comm::time_collectives(false);
  const loom::comm::traffic after_scope = loom::comm::traffic_so_far();
  CHECK(after_scope.in_flight_ns - idle.in_flight_ns >= ns(std::chrono::milliseconds(15)));
  pause();
  CHECK(loom::comm::traffic_so_far().in_flight_ns == after_scope.in_flight_ns);
}

// ------------------------------------------------------------------ dp
namespace {
// A Cloneable module (dp replicates by clone) that counts, across its
// replicas, the forwards that ran under CPU autocast and on another thread.
struct DpNetImpl : torch::nn::Cloneable<DpNetImpl> {
  DpNetImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    if (loom::compat::autocast_enabled(c10::DeviceType::CPU)) ++seen->autocast;
    if (std::this_thread::get_id() != seen->caller) ++seen->other_thread;
    return fc2(torch::relu(fc1(x)));
  }
  struct counters {
    std::atomic<int> autocast{0}, other_thread{0};
    std::thread::id caller = std::this_thread::get_id();
  };
  std::shared_ptr<counters> seen = std::make_shared<counters>();  // shared by the clones
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DpNet);

double max_gradient_difference(const DpNet& a, const DpNet& b) {
  double worst = 0;
  const auto pa = a->parameters(), pb = b->parameters();
  for (std::size_t k = 0; k < pa.size(); ++k) worst = std::max(worst, (pa[k].grad() - pb[k].grad()).abs().max().item<double>());
  return worst;
}
}  // namespace

TEST_CASE("dp: two replicas on the CPU equal one module on the whole batch, gradients summed by autograd", "[contract][dp]") {
  at::manual_seed(3);
  DpNet net;
  DpNet reference(std::dynamic_pointer_cast<DpNetImpl>(net->clone()));
  const c10::Device cpu(c10::kCPU);
  loom::detail::replica_set replicas(*net, {cpu, cpu});
  torch::optim::SGD sgd(net->parameters(), 0.1), reference_sgd(reference->parameters(), 0.1);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = at::randn({10, 8}), y = at::randint(0, 3, {10});
    sgd.zero_grad();
    reference_sgd.zero_grad();
    const at::Tensor out = loom::detail::data_parallel_forward(
        replicas, *net, [](DpNetImpl& module, const at::Tensor& chunk) { return module.forward(chunk); }, x);
    torch::nn::functional::cross_entropy(out, y).backward();
    const at::Tensor expected = reference->forward(x);
    torch::nn::functional::cross_entropy(expected, y).backward();
    CHECK(out.sizes() == expected.sizes());
    CHECK((out - expected).abs().max().item<double>() < 1e-6);
    CHECK(max_gradient_difference(net, reference) < 1e-6);
    // The replica's parameters are not leaves: their gradient went to the root's.
    for (const auto& p : replicas.replica(1).parameters()) CHECK_FALSE(p.grad().defined());
    sgd.step();
    reference_sgd.step();  // the next forward refreshes the replica from the stepped root
  }
  CHECK(net->seen->other_thread.load() == 3);  // one replica per step ran on a thread of its own
  // A structured output: each tensor gathered, 0-dim ones stacked (one per replica).
  const auto pair = loom::detail::data_parallel_forward(
      replicas, *net,
      [](DpNetImpl& module, const at::Tensor& chunk) {
        at::Tensor out = module.forward(chunk);
        return std::make_tuple(out, out.sum());
      },
      at::randn({6, 8}));
  CHECK(std::get<0>(pair).sizes() == at::IntArrayRef({6, 3}));
  CHECK(std::get<1>(pair).sizes() == at::IntArrayRef({2}));
  // A batch of one row runs on the root only.
  CHECK(loom::detail::replicas_for(2, at::randn({1, 8})) == 1);
}

TEST_CASE("dp: the strategy through a wrapped module enters the precision's autocast in every replica thread", "[contract][dp]") {
  at::manual_seed(4);
  DpNet net;
  DpNet reference(std::dynamic_pointer_cast<DpNetImpl>(net->clone()));
  const c10::Device cpu(c10::kCPU);
  loom::dp strategy(std::vector<c10::Device>{cpu, cpu});
  loom::bf16_mixed precision;
  auto state = strategy.setup_module(*net);
  using session = loom::strategy_session<loom::dp, loom::bf16_mixed, c10::kCPU>;
  loom::fabric_module<DpNet, loom::dp, loom::bf16_mixed, c10::kCPU> model(net, session(strategy, precision, state));
  const at::Tensor x = at::randn({8, 8});
  const at::Tensor out = model(x);
  CHECK(net->seen->autocast.load() == 2);  // both replicas, each in its own thread
  CHECK(out.scalar_type() == at::kFloat);   // converted back after the gather
  at::Tensor expected;
  {
    auto context = precision.forward_context(c10::kCPU);
    expected = reference->forward(x).to(at::kFloat);
  }
  CHECK((out - expected).abs().max().item<double>() < 1e-2);
  // Lightning's dp all_reduce: the mean of each tensor, in its dtype.
  CHECK(strategy.all_reduce(at::tensor({1.0f, 3.0f})).item<float>() == 2.0f);
  CHECK(strategy.world_size() == 1);
}

// ---------------------------------------------------------------- the device rule
// Every tensor a collective sends must live on the group's device (NCCL
// refuses CPU tensors). A one-rank Gloo group whose device is `meta` stands in
// for a GPU group on this CPU machine: a tensor built on the CPU is refused
// before it reaches Gloo, naming the call; code that builds its tensors on
// group.device() passes the check and reaches Gloo, which then refuses meta
// storage ("unsupported device type"). So for each of loom's sites: the
// error names the collective and is not the device rule's.
namespace {
constexpr const char* device_rule = "was handed to a process group whose device is";

// What `call(group)` throws on a fresh one-rank group on `meta` ("" when it
// returns). Fresh each time: a failed collective leaves a group unusable.
template <class Call>
std::string on_meta_group(Call&& call) {
  loom_test::scratch_dir dir("device-rule");
  loom::comm::group_options options;
  options.device = c10::Device(c10::DeviceType::Meta);
  options.collective_timeout = std::chrono::milliseconds(0);
  auto group = loom::comm::process_group::connect({.file_path = dir.file("store")}, 0, 1, options);
  REQUIRE(group.device() == c10::Device(c10::DeviceType::Meta));
  try {
    call(group);
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

at::Tensor meta_ones() { return at::ones({2}, at::TensorOptions().device(c10::DeviceType::Meta)); }
}  // namespace

TEST_CASE("the device rule: a collective refuses a tensor off the group's device, naming the call", "[contract][comm]") {
  using group_t = loom::comm::process_group;
  const at::Tensor cpu = at::ones({2});
  CHECK_THAT(on_meta_group([&](group_t& g) { at::Tensor t = cpu.clone(); g.all_reduce(t); }),
             Catch::Contains("all_reduce: a tensor on cpu") && Catch::Contains(device_rule) &&
                 Catch::Contains("meta") && Catch::Contains("group.device()"));
  CHECK_THAT(on_meta_group([&](group_t& g) { at::Tensor t = cpu.clone(); g.broadcast(t); }),
             Catch::Contains("broadcast: a tensor on cpu"));
  CHECK_THAT(on_meta_group([&](group_t& g) { (void)g.all_gather_stacked(cpu); }),
             Catch::Contains("all_gather: a tensor on cpu"));
  CHECK_THAT(on_meta_group([&](group_t& g) { g.all_gather_into(at::empty({2}), cpu).wait(); }),
             Catch::Contains("all_gather_into: a tensor on cpu"));
  CHECK_THAT(on_meta_group([&](group_t& g) { g.reduce_scatter_into(at::empty({2}), cpu).wait(); }),
             Catch::Contains("reduce_scatter_into: a tensor on cpu"));
  // On the group's device the check passes, and Gloo refuses meta storage.
  CHECK_THAT(on_meta_group([&](group_t& g) { at::Tensor t = meta_ones(); g.all_reduce(t); }),
             Catch::Contains("all_reduce") && !Catch::Contains(device_rule));
}

TEST_CASE("the device rule: loom's own tensors for collectives are built on the group's device", "[contract][comm]") {
  using group_t = loom::comm::process_group;
  // reduce_boolean_decision's vote (src/strategy/collectives.cpp).
  CHECK_THAT(on_meta_group([](group_t& g) { (void)loom::collectives::reduce_boolean_decision(g, true, true); }),
             Catch::Contains("all_reduce") && !Catch::Contains(device_rule));
  // broadcast_object's length (src/comm/process_group.cpp).
  CHECK_THAT(on_meta_group([](group_t& g) { (void)g.broadcast_object(c10::IValue(std::string("x"))); }),
             Catch::Contains("broadcast") && !Catch::Contains(device_rule));
  // all_gather_per_rank's shape exchange (src/comm/process_group.cpp).
  CHECK_THAT(on_meta_group([](group_t& g) { (void)g.all_gather_per_rank(meta_ones()); }),
             Catch::Contains("all_gather") && !Catch::Contains(device_rule));
  // ZeRO's found-inf flag (src/strategy/zero_loss_scaler.cpp) and tensor
  // parallel's norm (clip_placed, src/strategy/placement.cpp), over CPU gradients.
  torch::nn::Linear linear(2, 1);
  for (auto& p : linear->parameters()) p.mutable_grad() = at::ones_like(p);
  torch::optim::SGD sgd(linear->parameters(), 0.1);
  loom::zero_loss_scaler scaler;
  CHECK_THAT(on_meta_group([&](group_t& g) { (void)scaler.unscale_and_check(sgd, &g); }),
             Catch::Contains("all_reduce") && !Catch::Contains(device_rule));
  CHECK_THAT(on_meta_group([&](group_t& g) {
               std::vector<loom::detail::placement> chunked;
               for (const auto& p : linear->parameters()) {
                 chunked.push_back({.parameter = p, .local = p.detach(), .shape = p.sizes().vec(), .dim = 0,
                                    .chunk_group = g});
               }
               (void)loom::detail::clip_placed(chunked, loom::clip_options{.max_norm = 1.0});
             }),
             Catch::Contains("all_reduce") && !Catch::Contains(device_rule));
}
