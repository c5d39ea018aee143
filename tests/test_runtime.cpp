// The run-time layer: the connector's table of inputs, auto choices,
// conflicts and LT_* cases; the registry; AnyFabric against the static Fabric.
#include "test_models.hpp"

#include "catch.hpp"
#include <loom/any_fabric.hpp>
#include <loom/loom.hpp>
#include <loom/runtime/connector.hpp>
#include <loom/runtime/register_strategy.hpp>
#include <loom/runtime/registry.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <map>
#include <string>

namespace {

using loom::runtime::connect;
using loom::runtime::connector_input;
using env_map = std::map<std::string, std::string>;

const loom::runtime::machine_facts& cpu_machine() {
  static const auto facts = loom::runtime::builtin_machine(0, false);
  return facts;
}
const loom::runtime::machine_facts& gpu_machine() {  // a CUDA build with 2 devices (names only: nothing runs)
  static const auto facts = loom::runtime::builtin_machine(2, true);
  return facts;
}

loom::runtime::connection resolve(connector_input input, const env_map& env = {},
                                  const loom::runtime::machine_facts& machine = cpu_machine()) {
  return connect(std::move(input), machine, loom::cluster::recorded_environment(env));
}

std::string refusal(connector_input input, const env_map& env = {},
                    const loom::runtime::machine_facts& machine = cpu_machine()) {
  try {
    resolve(std::move(input), env, machine);
  } catch (const loom::configuration_error& error) {
    return error.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("connector: defaults and auto choices", "[runtime]") {
  auto plain = resolve({});
  CHECK(plain.accelerator == "cpu");
  CHECK(plain.strategy == "single_device");
  CHECK(plain.precision == "32-true");
  CHECK(plain.processes_per_node == 1);
  CHECK(plain.warnings.empty());

  CHECK(resolve({.devices = 2}).strategy == "ddp");
  CHECK(resolve({.devices = "3"}).processes_per_node == 3);
  CHECK(resolve({.num_nodes = 2}).strategy == "ddp");
  CHECK(resolve({.strategy = "DDP_fork", .devices = 2}).strategy == "ddp_fork");  // lower-cased, as Lightning
  // auto accelerator: cuda when a CUDA build sees devices; devices auto = all of them.
  auto gpu = resolve({}, {}, gpu_machine());
  CHECK(gpu.accelerator == "cuda");
  CHECK(gpu.processes_per_node == 2);
  CHECK(gpu.strategy == "ddp");
  CHECK(resolve({.accelerator = "gpu", .devices = "1"}, {}, gpu_machine()).strategy == "single_device");
  CHECK(resolve({.accelerator = "cuda", .devices = "0,1"}, {}, gpu_machine()).processes_per_node == 2);
  CHECK(resolve({.accelerator = "cuda", .devices = -1}, {}, gpu_machine()).processes_per_node == 2);
  CHECK(resolve({.accelerator = "cuda", .devices = {1}}, {}, gpu_machine()).processes_per_node == 1);
  // devices not given under torchrun: what the launcher started on this node.
  auto elastic = resolve({}, {{"TORCHELASTIC_RUN_ID", "x"}, {"RANK", "1"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "2"},
                              {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", "29500"}});
  CHECK(elastic.cluster.name == "torchelastic");
  CHECK(elastic.processes_per_node == 2);
  CHECK(elastic.strategy == "ddp");
}

TEST_CASE("connector: precision inputs and Lightning's fallbacks", "[runtime]") {
  const std::vector<std::pair<loom::runtime::precision_input, std::string>> table = {
      {64, "64-true"},         {"64", "64-true"},         {"64-true", "64-true"},  {32, "32-true"},
      {"32", "32-true"},       {"32-true", "32-true"},    {"bf16-true", "bf16-true"},
      {"bf16-mixed", "bf16-mixed"}, {"bf16", "bf16-mixed"}, {16, "bf16-mixed"}, {"16", "bf16-mixed"},
      {"16-mixed", "bf16-mixed"},
  };
  for (const auto& [input, expected] : table) {
    INFO(input.text());
    CHECK(resolve({.precision = input}).precision == expected);
  }
  // Legacy spellings warn (not 32/64, as Lightning); 16-mixed on cpu falls back with Lightning's warning.
  CHECK(resolve({.precision = "32"}).warnings.empty());
  auto legacy = resolve({.precision = "bf16"});
  REQUIRE(legacy.warnings.size() == 1);
  CHECK_THAT(legacy.warnings[0], Catch::Contains("historical reasons") && Catch::Contains("bf16-mixed"));
  auto fallback = resolve({.precision = "16-mixed"});
  REQUIRE(fallback.warnings.size() == 1);
  CHECK_THAT(fallback.warnings[0], Catch::Contains("not supported on CPU") && Catch::Contains("bf16-mixed"));
  CHECK(resolve({.accelerator = "cuda", .precision = "16-mixed"}, {}, gpu_machine()).precision == "16-mixed");
  CHECK(resolve({.accelerator = "cuda", .precision = "16-true"}, {}, gpu_machine()).precision == "16-true");
  CHECK_THAT(refusal({.precision = "16-true"}), Catch::Contains("no fp16 matmul") && Catch::Contains("bf16-true"));
  CHECK_THAT(refusal({.precision = "8-true"}),
             Catch::Contains("precision '8-true' is not valid") && Catch::Contains("bf16-mixed"));
  CHECK_THAT(refusal({.precision = 8}), Catch::Contains("precision '8'"));
}

TEST_CASE("connector: impossible requests say what is accepted", "[runtime]") {
  CHECK_THAT(refusal({.strategy = "no_such_strategy"}),
             Catch::Contains("unknown strategy 'no_such_strategy'") && Catch::Contains("ddp"));
  CHECK_THAT(refusal({.accelerator = "quantum"}), Catch::Contains("unknown accelerator") && Catch::Contains("cpu"));
  CHECK_THAT(refusal({.accelerator = "mps"}), Catch::Contains("MPS") && Catch::Contains("not in this LibTorch"));
  CHECK_THAT(refusal({.accelerator = "tpu"}), Catch::Contains("XLA"));
  CHECK_THAT(refusal({.accelerator = "cuda"}), Catch::Contains("built without CUDA"));
  CHECK_THAT(refusal({.accelerator = "gpu"}), Catch::Contains("no supported GPU backend"));
  CHECK_THAT(refusal({.accelerator = "cuda", .devices = 3}, {}, gpu_machine()),
             Catch::Contains("asks for 3 devices but this machine has 2"));
  CHECK_THAT(refusal({.accelerator = "cuda", .devices = "0,5"}, {}, gpu_machine()),
             Catch::Contains("device index 5 does not exist"));
  CHECK_THAT(refusal({.devices = 0}), Catch::Contains("devices=0 is not a valid input"));
  CHECK_THAT(refusal({.devices = "0"}), Catch::Contains("is not a valid input"));
  CHECK_THAT(refusal({.devices = std::vector<int>{}}), Catch::Contains("is not a valid input"));
  CHECK_THAT(refusal({.devices = {0, 1}}), Catch::Contains("counted, not selected by index"));
  CHECK_THAT(refusal({.devices = -1}), Catch::Contains("must be positive"));
  CHECK_THAT(refusal({.num_nodes = 0}), Catch::Contains("num_nodes=0"));
  CHECK_THAT(refusal({.strategy = "ddp_spawn"}), Catch::Contains("no C++ meaning") && Catch::Contains("use ddp"));
  CHECK_THAT(refusal({.strategy = "ddp_notebook"}), Catch::Contains("use ddp"));
  CHECK_THAT(refusal({.strategy = "deepspeed"}), Catch::Contains("not built yet") && Catch::Contains("single_device"));
  // Lightning refuses FSDP on cpu; loom's runs there (a deliberate difference). Sharded
  // strategies refuse 64-true (not among Lightning's FSDP precisions) and 16-mixed.
  CHECK(resolve({.strategy = "fsdp", .devices = 2}).strategy == "fsdp");
  CHECK_THAT(refusal({.strategy = "fsdp", .devices = 2, .precision = "64-true"}),
             Catch::Contains("a sharded strategy") && Catch::Contains("bf16-mixed"));
  CHECK_THAT(refusal({.accelerator = "cuda", .strategy = "fsdp", .precision = "16-mixed"}, {}, gpu_machine()),
             Catch::Contains("inf check is reduced over the shards"));
  CHECK_THAT(refusal({.strategy = "xla"}), Catch::Contains("XLA"));
  CHECK_THAT(refusal({.strategy = "single_device", .devices = 2}), Catch::Contains("runs one process"));
  // dp on cpu becomes ddp, with Lightning's warning.
  auto dp = resolve({.strategy = "dp", .devices = 2});
  CHECK(dp.strategy == "ddp");
  REQUIRE(dp.warnings.size() == 1);
  CHECK_THAT(dp.warnings[0], Catch::Contains("'dp' is not supported on CPUs"));
}

TEST_CASE("connector: under loom-run the LT_* values decide, conflicts name both", "[runtime]") {
  const env_map cli = {{"LT_CLI_USED", "1"},     {"LT_ACCELERATOR", "cpu"}, {"LT_STRATEGY", "ddp"},
                       {"LT_DEVICES", "2"},      {"LT_NUM_NODES", "1"},     {"LT_PRECISION", "bf16-mixed"}};
  auto taken = resolve({}, cli);
  CHECK(taken.strategy == "ddp");
  CHECK(taken.processes_per_node == 2);
  CHECK(taken.precision == "bf16-mixed");
  // Values equal to the CLI's, or canonically equal, agree.
  CHECK(resolve({.accelerator = "cpu", .strategy = "ddp", .devices = 2, .precision = "bf16"}, cli).strategy == "ddp");
  CHECK_THAT(refusal({.strategy = "single_device"}, cli),
             Catch::Contains("strategy=single_device") && Catch::Contains("--strategy=ddp") &&
                 Catch::Contains("Remove it either from the command line or from the code"));
  CHECK_THAT(refusal({.devices = 4}, cli), Catch::Contains("devices=4") && Catch::Contains("--devices=2"));
  CHECK_THAT(refusal({.precision = "64-true"}, cli), Catch::Contains("--precision=bf16-mixed"));
  CHECK_THAT(refusal({.num_nodes = 3}, cli), Catch::Contains("--num_nodes=1"));
  CHECK_THAT(refusal({.accelerator = "cuda"}, cli), Catch::Contains("--accelerator=cpu"));
  // Without LT_CLI_USED the variables are not loom-run's and are ignored.
  env_map stray = cli;
  stray.erase("LT_CLI_USED");
  CHECK(resolve({}, stray).strategy == "single_device");
  // The CLI's own values are checked like the code's.
  CHECK_THAT(refusal({}, {{"LT_CLI_USED", "1"}, {"LT_STRATEGY", "nope"}}), Catch::Contains("unknown strategy 'nope'"));
}

TEST_CASE("registry: built names match the catalog; registering needs override for existing names", "[runtime]") {
  auto& shared = loom::runtime::registry::instance();
  std::vector<std::string> built;
  for (const auto& entry : loom::runtime::strategy_names()) {
    if (entry.built) built.push_back(entry.name);
  }
  CHECK(shared.strategy_names() == built);
  // cpu has no fp16 / 16-mixed combination; every other precision is there for every name.
  CHECK(shared.find("cpu", "ddp", "bf16-mixed") != nullptr);
  CHECK(shared.find("cpu", "ddp", "16-mixed") == nullptr);
  CHECK(shared.find("cpu", "single_device", "16-true") == nullptr);
  CHECK(shared.find("cpu", "parallel_fork", "64-true") != nullptr);
  // Sharded strategies take 3 of them (no 64-true).
  std::size_t sharded = 0;
  for (const auto& entry : loom::runtime::strategy_names()) sharded += entry.built && entry.sharded ? 1 : 0;
  CHECK(sharded == 2);
  CHECK(shared.find("cpu", "fsdp", "64-true") == nullptr);
  CHECK(shared.find("cpu", "fsdp", "bf16-mixed") != nullptr);
  CHECK(shared.entries().size() == built.size() * 4 - sharded);

  auto copy = *shared.find("cpu", "single_device", "32-true");
  copy.strategy = "ddp";
  CHECK_THROWS_WITH(shared.add_strategy({copy}), Catch::Contains("already registered") &&
                                                     Catch::Contains("override_existing"));
}

namespace {
// One training step through a fabric: loss before the step.
template <class F>
std::vector<double> train(F& fabric, int steps) {
  torch::manual_seed(7);
  loom_test::Mlp net(16, 32, 4);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer] = fabric.setup(net, sgd);
  torch::manual_seed(8);
  const at::Tensor x = torch::randn({steps, 8, 16});
  const at::Tensor y = torch::randint(0, 4, {steps, 8});
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(x[step]), y[step]);
    fabric.backward(loss);
    fabric.clip_gradients(model, optimizer, {.max_norm = 1.0});
    optimizer.step();
    losses.push_back(loss.template item<double>());
  }
  return losses;
}
}  // namespace

TEST_CASE("AnyFabric from make_fabric trains exactly as the static Fabric", "[runtime]") {
  for (const char* precision : {"32-true", "bf16-mixed", "64-true", "bf16-true"}) {
    INFO(precision);
    auto any = loom::make_fabric({.accelerator = "cpu", .strategy = "single_device", .precision = precision});
    CHECK(any.precision_name() == precision);
    std::vector<double> expected;
    if (std::string(precision) == "32-true") {
      loom::Fabric<loom::cpu, loom::single_device, loom::fp32> fabric;
      expected = train(fabric, 5);
      REQUIRE(any.target<loom::Fabric<loom::cpu, loom::single_device, loom::fp32>>() != nullptr);
    } else if (std::string(precision) == "bf16-mixed") {
      loom::Fabric<loom::cpu, loom::single_device, loom::bf16_mixed> fabric;
      expected = train(fabric, 5);
    } else if (std::string(precision) == "64-true") {
      loom::Fabric<loom::cpu, loom::single_device, loom::fp64> fabric;
      expected = train(fabric, 5);
    } else {
      loom::Fabric<loom::cpu, loom::single_device, loom::bf16> fabric;
      expected = train(fabric, 5);
    }
    CHECK(train(any, 5) == expected);
  }
}

TEST_CASE("AnyFabric: autocast, no_backward_sync, collectives, save and load", "[runtime]") {
  auto fabric = loom::make_fabric({.precision = "bf16-mixed"});
  CHECK(fabric.strategy_name() == "single_device");
  CHECK(fabric.world_size() == 1);
  {
    auto guard = fabric.autocast();
    const at::Tensor a = torch::ones({2, 2});
    CHECK(at::mm(a, a).scalar_type() == at::kBFloat16);
  }
  CHECK(at::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == at::kFloat);
  loom_test::Mlp net(4, 8, 2);
  auto model = fabric.setup(net);
  CHECK(model(torch::ones({3, 4})).scalar_type() == at::kFloat);  // outputs back to the default dtype
  CHECK(net->hidden_dtype == at::kBFloat16);
  {
    auto guard = fabric.no_backward_sync(model);
    fabric.backward(model(torch::ones({3, 4})).sum());
  }
  std::vector<at::Tensor> nested{torch::ones({2}), torch::full({1}, 3.0)};
  auto reduced = fabric.all_reduce(nested, loom::reduce_op::mean);
  CHECK(reduced[1].item<double>() == 3.0);
  CHECK_THROWS_WITH(fabric.all_reduce(torch::ones({2}, at::kLong), loom::reduce_op::mean), Catch::Contains("mean"));
  CHECK(fabric.broadcast_object(std::string("x")) == "x");

  loom_test::scratch_dir dir("any_fabric");
  std::int64_t step = 5;
  fabric.save(dir.file("ckpt"), {{"model", model}, {"step", step}});
  const at::Tensor before = net->fc1->weight.detach().clone();
  torch::NoGradGuard no_grad;
  net->fc1->weight.add_(1.0);
  step = 0;
  fabric.load(dir.file("ckpt"), {{"model", model}, {"step", step}});
  CHECK(step == 5);
  CHECK(torch::equal(net->fc1->weight, before));
}

TEST_CASE("make_fabric refuses what the connector refuses", "[runtime]") {
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "no_such_strategy"}),
                    Catch::Contains("unknown strategy") && Catch::Contains("ddp"));
  CHECK_THROWS_WITH(loom::make_fabric({.precision = "16-true"}), Catch::Contains("no fp16 matmul"));
}

TEST_CASE("users register their own names; an existing name needs the override flag", "[runtime]") {
  using loom::runtime::register_strategy;
  auto make = [] { return loom::single_device{}; };
  register_strategy<loom::single_device>("my_single", "loom::single_device", "a user's name", +make);
  auto fabric = loom::make_fabric({.strategy = "my_single", .precision = "64-true"});
  CHECK(fabric.strategy_name() == "my_single");
  CHECK(fabric.precision_name() == "64-true");
  CHECK_THROWS_WITH(register_strategy<loom::single_device>("my_single", "loom::single_device", "again", +make),
                    Catch::Contains("already registered"));
  CHECK_THROWS_WITH(register_strategy<loom::single_device>("ddp", "loom::single_device", "shadow", +make),
                    Catch::Contains("already registered"));
  register_strategy<loom::single_device>("my_single", "loom::single_device", "replaced", +make,
                                         {.override_existing = true});
  CHECK(loom::runtime::registry::instance().find("cpu", "my_single", "32-true")->description == "replaced");
  // The connector knows the new name (and lists it when a name is unknown).
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "nope"}), Catch::Contains("my_single"));
}
