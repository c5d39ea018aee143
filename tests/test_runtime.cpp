// The run-time layer: the connector's table of inputs, auto choices,
// conflicts and LT_* cases; the registry; AnyFabric against the static Fabric.
#include "test_models.hpp"

#include "catch.hpp"
#include <loom/any_fabric.hpp>
#include <loom/loom.hpp>
#include <loom/strategy/zero_config.hpp>  // the resolved DeepSpeed configuration
#include <loom/accelerator/cpu_features.hpp>
#include <loom/runtime/connector.hpp>
#include <loom/runtime/register_strategy.hpp>
#include <loom/runtime/registry.hpp>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <iostream>
#include <map>
#include <sstream>
#include <string>

namespace {

using loom::runtime::connect;
using loom::runtime::connector_input;
using env_map = std::map<std::string, std::string>;

// Machine facts whose CPU does or does not vectorize bfloat16 matmuls
// (AVX-512), so that bf16 adds a warning only where a test asks for one,
// whatever machine runs the tests.
loom::runtime::machine_facts machine_with(int cuda_devices, bool cuda_built, bool vector_bf16) {
  auto facts = loom::runtime::builtin_machine(cuda_devices, cuda_built);
  facts.cpu_vector_bf16 = vector_bf16;
  return facts;
}
const loom::runtime::machine_facts& cpu_machine() {
  static const auto facts = machine_with(0, false, true);
  return facts;
}
const loom::runtime::machine_facts& slow_bf16_machine() {  // AVX2 only: a scalar loop computes bf16 matmuls
  static const auto facts = machine_with(0, false, false);
  return facts;
}
const loom::runtime::machine_facts& gpu_machine() {  // a CUDA build with 2 devices (names only: nothing runs)
  static const auto facts = machine_with(2, true, true);
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
  // bf16 on a CPU without AVX-512 runs, and says why it is slow and what to use.
  for (const char* bf16 : {"bf16-mixed", "bf16-true"}) {
    auto slow = resolve({.precision = bf16}, {}, slow_bf16_machine());
    CHECK(slow.precision == bf16);
    REQUIRE(slow.warnings.size() == 1);
    CHECK_THAT(slow.warnings[0], Catch::Contains(std::string("precision='") + bf16 + "' on this CPU") &&
                                     Catch::Contains("AVX-512") && Catch::Contains("scalar loop") &&
                                     Catch::Contains("Use '32-true' here"));
  }
  CHECK(resolve({.precision = "32-true"}, {}, slow_bf16_machine()).warnings.empty());
  CHECK(resolve({.accelerator = "cuda", .precision = "bf16-mixed"}, {}, machine_with(2, true, false)).warnings.empty());
  CHECK(resolve({.accelerator = "cuda", .precision = "16-true"}, {}, gpu_machine()).precision == "16-true");
  CHECK_THAT(refusal({.precision = "16-true"}), Catch::Contains("no fp16 matmul") && Catch::Contains("bf16-true"));
  CHECK_THAT(refusal({.precision = "8-true"}),
             Catch::Contains("precision '8-true' is not valid") && Catch::Contains("bf16-mixed"));
  CHECK_THAT(refusal({.precision = 8}), Catch::Contains("precision '8'"));
}

TEST_CASE("resolve prints each connector warning once per process", "[runtime]") {
  // Applications resolve before make_fabric to pick options by the chosen
  // strategy (examples/fashion_mnist.cpp): three resolutions, at most one
  // line (none if an earlier test in this process printed it already).
  std::ostringstream captured;
  auto* const original = std::cerr.rdbuf(captured.rdbuf());
  for (int i = 0; i < 3; ++i) {
    const auto resolved = loom::runtime::resolve(loom::fabric_config{.precision = "bf16"}, std::nullopt);
    // The list keeps it every time (and, on a CPU without AVX-512, the bf16 one).
    CHECK(resolved.chosen.warnings.size() == (loom::cpu_features::vector_bf16_matmul() ? 1u : 2u));
  }
  std::cerr.rdbuf(original);
  const std::string text = captured.str();
  std::size_t lines = 0;
  for (auto at = text.find("historical reasons"); at != std::string::npos; at = text.find("historical reasons", at + 1)) {
    ++lines;
  }
  CHECK(lines <= 1);
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
  // model_parallel resolves (loom-run sets it) but is made from an object only.
  CHECK(resolve({.strategy = "model_parallel", .devices = 2}).strategy == "model_parallel");
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "model_parallel", .devices = 2}),
                    Catch::Contains("cannot be made from its name") && Catch::Contains("parallelize_fn"));
  // ZeRO under Lightning's names runs on cpu too (Lightning refuses DeepSpeed there).
  CHECK(resolve({.strategy = "deepspeed_stage_3", .devices = 2}).strategy == "deepspeed_stage_3");
  // Lightning refuses FSDP on cpu; loom's runs there (a deliberate difference). Sharded
  // strategies refuse 64-true (not among Lightning's FSDP precisions) and 16-mixed.
  CHECK(resolve({.strategy = "fsdp", .devices = 2}).strategy == "fsdp");
  CHECK_THAT(refusal({.strategy = "fsdp", .devices = 2, .precision = "64-true"}),
             Catch::Contains("a sharded strategy") && Catch::Contains("bf16-mixed"));
  CHECK_THAT(refusal({.accelerator = "cuda", .strategy = "fsdp", .precision = "16-mixed"}, {}, gpu_machine()),
             Catch::Contains("inf check is reduced over the shards"));
  // ZeRO scales the loss itself (DeepSpeed's loss scaler): 16-mixed on cuda, not on cpu (no fp16 kernels).
  CHECK(resolve({.accelerator = "cuda", .strategy = "deepspeed", .precision = "16-mixed"}, {}, gpu_machine())
            .precision == "16-mixed");
  CHECK_THAT(refusal({.accelerator = "cpu", .strategy = "deepspeed", .precision = "64-true"}),
             Catch::Contains("a sharded strategy"));
  CHECK_THAT(refusal({.strategy = "xla"}), Catch::Contains("XLA"));
  CHECK_THAT(refusal({.strategy = "single_device", .devices = 2}), Catch::Contains("runs one process"));
  // dp on cpu becomes ddp, with Lightning's warning.
  auto dp = resolve({.strategy = "dp", .devices = 2});
  CHECK(dp.strategy == "ddp");
  REQUIRE(dp.warnings.size() == 1);
  CHECK_THAT(dp.warnings[0], Catch::Contains("'dp' is not supported on CPUs"));
  // On cuda, dp is one process driving every selected device.
  auto dp_cuda = resolve({.accelerator = "cuda", .strategy = "dp", .devices = 2}, {}, gpu_machine());
  CHECK(dp_cuda.strategy == "dp");
  CHECK(dp_cuda.processes_per_node == 1);
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
  // Built names with a reason are made from a strategy object only (dp,
  // model_parallel: code a name cannot carry); the rest are registered.
  std::vector<std::string> built, object_only;
  for (const auto& entry : loom::runtime::strategy_names()) {
    if (entry.built) (entry.reason.empty() ? built : object_only).push_back(entry.name);
  }
  CHECK(shared.strategy_names() == built);
  CHECK(object_only == std::vector<std::string>{"dp", "model_parallel"});
  // cpu has no fp16 / 16-mixed combination; every other precision is there for every name.
  CHECK(shared.find("cpu", "ddp", "bf16-mixed") != nullptr);
  CHECK(shared.find("cpu", "ddp", "16-mixed") == nullptr);
  CHECK(shared.find("cpu", "single_device", "16-true") == nullptr);
  CHECK(shared.find("cpu", "parallel_fork", "64-true") != nullptr);
  // Sharded strategies take 3 of them (no 64-true).
  std::size_t sharded = 0;
  for (const auto& entry : loom::runtime::strategy_names()) sharded += entry.built && entry.reason.empty() && entry.sharded ? 1 : 0;
  CHECK(sharded == 10);  // fsdp, fsdp_cpu_offload and Lightning's eight deepspeed names
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

namespace {
constexpr loom::precision_dtypes fp32_dtypes = loom::precision_dtypes_of<loom::fp32>();
// The error resolving a DeepSpeed config (JSON text) gives, or "(accepted)".
std::string zero_refusal(const std::string& json, const loom::precision_dtypes& precision = {}, int world_size = 2) {
  try {
    loom::resolve_zero_config(loom::deepspeed_options{.config = json}, precision, world_size);
  } catch (const loom::configuration_error& error) {
    return error.what();
  }
  return "(accepted)";
}
}  // namespace

TEST_CASE("deepspeed: Lightning's defaults, presets and a ds_config.json as DeepSpeed reads it", "[runtime][zero]") {
  const auto defaults = loom::resolve_zero_config({}, fp32_dtypes, 2);
  CHECK(defaults.stage == 2);
  CHECK(defaults.offload_optimizer.device == loom::offload_device::none);
  CHECK(defaults.reduce_bucket_size == 200'000'000);
  CHECK(defaults.train_micro_batch_size_per_gpu == 1);  // Lightning's setdefault
  CHECK(defaults.gradient_accumulation_steps == 1);
  CHECK(defaults.notices.empty());
  CHECK(defaults.source == "the strategy's arguments");
  // deepspeed_stage_3_offload: optimizer and parameters to the CPU.
  const auto offload = loom::resolve_zero_config(
      loom::deepspeed_options{.stage = 3, .offload_optimizer = true, .offload_parameters = true}, fp32_dtypes, 2);
  CHECK(offload.offload_param.device == loom::offload_device::cpu);
  CHECK(offload.offload_param.buffer_count == 5);
  CHECK(offload.offload_optimizer.buffer_count == 4);
  // A config as DeepSpeed's docs write one: sizes as 5e8, batch sizes derived.
  const auto config = loom::resolve_zero_config(
      loom::deepspeed_options{.config = R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8,
        "gradient_clipping": 1.0, "steps_per_print": 10, "wall_clock_breakdown": false,
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8, "stage3_max_live_parameters": 1e9,
        "overlap_comm": true}, "aio": {"block_size": 262144, "queue_depth": 16}})"},
      fp32_dtypes, 2);
  CHECK(config.stage == 3);
  CHECK(config.gradient_accumulation_steps == 4);  // 64 / (8 x 2)
  CHECK(config.reduce_bucket_size == 500'000'000);
  CHECK(config.aio.queue_depth == 16);
  CHECK(config.source == "a config object");
  CHECK(config.notices.size() == 3);  // steps_per_print, wall_clock_breakdown, stage3_max_live_parameters
  // A user config replaces the arguments (as Lightning): stage 0 when it has no zero_optimization.
  CHECK(loom::resolve_zero_config(loom::deepspeed_options{.stage = 3, .config = "{}"}, fp32_dtypes, 2).stage == 0);
  // The precision adds its section when the config has none.
  CHECK(loom::resolve_zero_config({}, loom::precision_dtypes_of<loom::bf16_mixed>(), 2).bf16);
  CHECK(loom::resolve_zero_config({}, loom::precision_dtypes_of<loom::fp16_mixed>(), 2).fp16.initial_scale_power ==
        16);
}

TEST_CASE("deepspeed: bad configs name the key, the value and what is accepted", "[runtime][zero]") {
  CHECK_THAT(zero_refusal(R"({"zero_optimization": {"stage": 2, "bucket_size": 5}})"),
             Catch::Contains("unknown key 'zero_optimization.bucket_size'") &&
                 Catch::Contains("reduce_bucket_size"));
  CHECK_THAT(zero_refusal(R"({"train_batch_sise": 8})"),
             Catch::Contains("unknown key 'train_batch_sise'") && Catch::Contains("train_batch_size"));
  CHECK_THAT(zero_refusal(R"({"zero_optimization": {"stage": "2"}})"),
             Catch::Contains("'zero_optimization.stage' = \"2\" is not an integer"));
  CHECK_THAT(zero_refusal(R"({"zero_optimization": {"stage": 4}})"),
             Catch::Contains("'zero_optimization.stage' = 4 is not a ZeRO stage: 0, 1, 2 or 3"));
  CHECK_THAT(zero_refusal(R"({"gradient_accumulation_steps": "auto"})"),
             Catch::Contains("\"auto\" is a Hugging Face Trainer convention that DeepSpeed itself rejects"));
  CHECK_THAT(zero_refusal(R"({"zero_optimization": {"overlap_comm": 1}})"),
             Catch::Contains("'zero_optimization.overlap_comm' = 1 is not true or false"));
  CHECK_THAT(zero_refusal(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                              "gradient_accumulation_steps": 2})"),
             Catch::Contains("train_batch_size = 30 must equal") && Catch::Contains("4 x 2 x 2 = 16"));
  CHECK_THAT(zero_refusal(R"({"optimizer": {"type": "Adam", "params": {"lr": 0.001}}})"),
             Catch::Contains("'optimizer'") && Catch::Contains("pass a torch::optim optimizer to fabric.setup"));
  CHECK_THAT(zero_refusal(R"({"scheduler": {"type": "WarmupLR"}})"), Catch::Contains("is refused"));
  CHECK_THAT(zero_refusal(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
                              "nvme_path": "/tmp"}}})"),
             Catch::Contains("'zero_optimization.offload_optimizer.device' = \"nvme\" needs ZeRO stage 3") &&
                 Catch::Contains("NVMe offloading is available only with ZeRO stage 3"));
  CHECK_THAT(zero_refusal(R"({"zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}})"),
             Catch::Contains("'zero_optimization.offload_param.device' = \"cpu\" needs ZeRO stage 3"));
  CHECK_THAT(zero_refusal(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"),
             Catch::Contains("'zero_optimization.offload_param.nvme_path' is missing"));
  CHECK_THAT(zero_refusal(R"({"bf16": {"enabled": true}})"),
             Catch::Contains("'bf16.enabled' is true but the Fabric's precision is 32-true"));
  CHECK_THAT(zero_refusal(R"({"zero_optimization": {"stage": 2})"), Catch::Contains("is not valid JSON"));
  CHECK_THROWS_WITH(loom::resolve_zero_config({.config = "/no/such/ds_config.json"}, fp32_dtypes, 2),
                    Catch::Contains("the path does not exist: /no/such/ds_config.json"));
  // JSON from outside: nesting bounded (10^5 levels would overflow the stack
  // in nlohmann's recursive dump), no key twice, batch products checked.
  CHECK_THAT(zero_refusal("{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}"),
             Catch::Contains("nests deeper than 64 levels"));
  CHECK_THAT(zero_refusal(R"({"train_batch_size": 8, "train_batch_size": 16})"),
             Catch::Contains("gives the key 'train_batch_size' twice in one object"));
  CHECK_THAT(zero_refusal(R"({"zero_optimization": {"stage": 2, "stage": 3}})"),
             Catch::Contains("gives the key 'stage' twice"));
  // A number no double holds: nlohmann's out_of_range, which escaped as
  // itself (found by fuzzing: tests/fuzz/corpus/zero_config/regression_*).
  CHECK_THAT(zero_refusal(R"({"train_micro_batch_size_per_gpu": 1E1111111111})"),
             Catch::Contains("is not valid JSON") && Catch::Contains("number overflow"));
  CHECK_THAT(zero_refusal(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4611686018427387904,
                              "gradient_accumulation_steps": 4})"),
             Catch::Contains("= 4611686018427387904 x 4 x 2 does not fit in a 64-bit integer"));
  CHECK_THAT(zero_refusal(R"({"train_micro_batch_size_per_gpu": 4611686018427387904})"),
             Catch::Contains("does not fit in a 64-bit integer"));
  // Only a regular file is read as a config: /dev/zero would be read until memory ran out.
  CHECK_THROWS_WITH(loom::resolve_zero_config({.config = "/dev/zero"}, fp32_dtypes, 2),
                    Catch::Contains("deepspeed config /dev/zero: it is a character device, not a regular file"));
}

// optimizer.zero_grad(set_to_none) went to LibTorch directly, past the
// strategy (which decides when and how gradients are zeroed: DeepSpeed on
// its accumulation boundary). Both spellings must train as zero_grad() does.
// (On 1.13 the old path gave the same numbers here: the engine accumulates
// micro-batches in its own buffers.)
TEST_CASE("zero_grad(set_to_none) goes through the strategy: DeepSpeed keeps gradients between boundaries",
          "[runtime][zero]") {
  // Two micro-batches of one optimizer step, zeroing before each as the user does.
  auto train = [](auto&& fabric, auto zero_grad) {
    at::manual_seed(3);
    loom_test::Mlp net(4, 8, 2);
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, optimizer] = fabric.setup(net, sgd);
    for (int micro = 0; micro < 2; ++micro) {
      zero_grad(optimizer);
      fabric.backward(model(torch::full({3, 4}, 1.0 + micro)).sum());
      optimizer.step();
    }
    return net->fc1->weight.detach().clone();
  };
  const std::string config = R"({"config": {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2}})";
  auto any_fabric = [&] { return loom::make_fabric({.strategy = "deepspeed", .strategy_options = config, .devices = 1}); };
  const at::Tensor by_default = train(any_fabric(), [](auto& o) { o.zero_grad(); });
  CHECK(torch::equal(train(any_fabric(), [](auto& o) { o.zero_grad(true); }), by_default));
  CHECK(torch::equal(train(any_fabric(), [](auto& o) { o.zero_grad(false); }), by_default));
  using zero2 = loom::Fabric<loom::cpu, loom::deepspeed, loom::fp32>;
  auto static_fabric = [] {
    return zero2({}, loom::deepspeed(loom::deepspeed_options{
                         .config = R"({"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2})"}));
  };
  CHECK(torch::equal(train(static_fabric(), [](auto& o) { o.zero_grad(true); }), by_default));
}

// fsdp_cpu_offload refuses no_backward_sync at compile time
// (tests/compile_fail/fsdp.cpp); where offloading is a run-time option the
// same combination was accepted.
TEST_CASE("no_backward_sync is refused at run time where offloading is a run-time option", "[runtime][zero]") {
  auto refusal = [](auto&& fabric) -> std::string {
    loom_test::Mlp net(4, 8, 2);
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, optimizer] = fabric.setup(net, sgd);
    try {
      auto guard = fabric.no_backward_sync(model);
    } catch (const loom::configuration_error& error) {
      return error.what();
    }
    return "(accepted)";
  };
  // Catch's && keeps references to its parts: they are named, so they outlive it.
  const auto names_offloading = Catch::Contains("offload");
  const auto says_why = Catch::Contains("skipped reductions would keep");
  const auto offload_sentence = names_offloading && says_why;
  CHECK_THAT(refusal(loom::Fabric<loom::cpu, loom::fsdp>({}, loom::fsdp(loom::fsdp_options{.cpu_offload = true}))),
             Catch::Contains("no_backward_sync") && offload_sentence);
  CHECK_THAT(refusal(loom::Fabric<loom::cpu, loom::deepspeed>(
                 {}, loom::deepspeed(loom::deepspeed_options{.stage = 2, .offload_optimizer = true}))),
             Catch::Contains("no_backward_sync") && offload_sentence);
  CHECK_THAT(refusal(loom::Fabric<loom::cpu, loom::deepspeed>({}, loom::deepspeed(loom::deepspeed_options{
                 .config = R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})"}))),
             Catch::Contains("no_backward_sync") && offload_sentence);
  // The offload presets are types: refused at compile time, as fsdp_cpu_offload
  // (whose Fabric::no_backward_sync static_assert tests/compile_fail/fsdp.cpp shows).
  static_assert(!loom::supports_no_backward_sync<loom::fsdp_cpu_offload>);
  static_assert(!loom::supports_no_backward_sync<loom::deepspeed_stage_1_offload> &&
                !loom::supports_no_backward_sync<loom::deepspeed_stage_2_offload> &&
                !loom::supports_no_backward_sync<loom::deepspeed_stage_3_offload> &&
                !loom::supports_no_backward_sync<loom::deepspeed_stage_3_offload_nvme>);
  static_assert(loom::supports_no_backward_sync<loom::deepspeed_stage_2>);
  CHECK_THAT(refusal(loom::make_fabric({.strategy = "deepspeed_stage_2_offload", .devices = 1})),
             Catch::Contains("no_backward_sync") && offload_sentence);
  // Without offloading it is a guard, as before.
  CHECK(refusal(loom::Fabric<loom::cpu, loom::fsdp>({}, loom::fsdp())) == "(accepted)");
}

TEST_CASE("deepspeed through make_fabric: one optimizer, set up with the module", "[runtime][zero]") {
  using zero3 = loom::Fabric<loom::cpu, loom::deepspeed_stage_3, loom::fp32>;
  auto fabric = loom::make_fabric(
      {.strategy = "deepspeed_stage_3", .strategy_options = R"({"config": {"zero_optimization": {"stage": 3},
        "gradient_accumulation_steps": 2}})", .devices = 1});
  REQUIRE(fabric.target<zero3>() != nullptr);
  CHECK(fabric.target<zero3>()->strategy().config().gradient_accumulation_steps == 2);
  CHECK(fabric.target<zero3>()->strategy().config().source == "a config object");
  loom_test::Mlp net(4, 8, 2);
  torch::optim::SGD first(net->parameters(), 0.1);
  torch::optim::SGD second(net->parameters(), 0.1);
  CHECK_THROWS_WITH(fabric.setup_module(net), Catch::Contains("sets up the module and its optimizers together"));
  CHECK_THROWS_WITH(fabric.setup(net, first, second), Catch::Contains("exactly one optimizer"));
  CHECK_THROWS_WITH(loom::make_fabric({.strategy = "deepspeed", .strategy_options = R"({"stage": 4})", .devices = 1}),
                    Catch::Contains("option 'stage' = 4 is not accepted: expected an integer from 0 to 3"));
  CHECK_THROWS_WITH(
      loom::make_fabric({.strategy = "deepspeed", .strategy_options = R"({"config": {"zero_optimization":
        {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}}})", .devices = 1}),
      Catch::Contains("NVMe offloading is available only with ZeRO stage 3"));
  // One optimizer: accumulation over two micro-batches, and no_backward_sync beside it refused.
  auto [model, optimizer] = fabric.setup(net, first);
  CHECK_THROWS_WITH(fabric.no_backward_sync(model), Catch::Contains("gradient_accumulation_steps = 2"));
  const at::Tensor before = net->fc1->weight.detach().clone();
  for (int micro = 0; micro < 2; ++micro) {
    optimizer.zero_grad();
    fabric.backward(model(torch::ones({3, 4})).sum());
    optimizer.step();
    CHECK(torch::equal(net->fc1->weight, before) == (micro == 0));  // steps on the boundary only
  }
}
