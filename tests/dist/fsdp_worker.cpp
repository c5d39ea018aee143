// FSDP's laws on real processes (tests/dist/fsdp.sh): the shared laws of
// strategy_laws.hpp (equivalence, gradient norm, accumulation, checkpoint
// round trip) for each sharding strategy, plus what is FSDP's own (prefetch,
// wrap policies, offload, bf16, a tied parameter, sharded checkpoints for
// the resharding checks). `fsdp_worker laws N` starts N ranks itself;
// `fsdp_worker hybrid` runs under loom-run --num-nodes 2.
#include "law_models.hpp"

#include <loom/strategy/fsdp_engine.hpp>  // the engine's counters
#include <loom/util/placeholder.hpp>

#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <typeindex>

namespace {

using laws::global_batch;
using laws::global_inputs;
using laws::global_targets;

using laws::make_net;
using laws::Net;
using laws::make_plain;
using laws::test_dir;
using laws::train_steps;

using fsdp_fabric = loom::Fabric<loom::cpu, loom::fsdp, loom::fp32>;

// The shared laws for each sharding strategy (sharded saves, the default),
// and the round trip of a full save.
void law_strategies(const std::vector<loom::sharding_strategy>& strategies) {
  for (auto strategy : strategies) {
    const std::string what(loom::to_string(strategy));
    fsdp_fabric fabric({}, loom::fsdp(loom::fsdp_options{.strategy = strategy}));
    laws::law_equivalence(fabric, make_net, what.c_str());
    laws::law_gradient_norm(fabric, make_net, what.c_str());
    laws::law_accumulation(fabric, make_net, what.c_str(), [&](auto& model, std::uint64_t synced) {
      // One reduction per unit that holds parameters.
      std::uint64_t units = 0;
      for (const auto& unit : model.session().state()->units()) units += unit.numel > 0 ? 1 : 0;
      LAW_EXPECT(synced == units, "%s: the synced backward reduced %llu times for %llu units", what.c_str(),
                 static_cast<unsigned long long>(synced), static_cast<unsigned long long>(units));
    });
    laws::law_checkpoint_round_trip(fabric, make_net, (what + ", sharded save").c_str());
    laws::law_zero_grad(fabric, make_net, what.c_str());
    laws::law_failed_step(fabric, laws::make_failing, what.c_str());
    laws::law_module_outlived(fabric, make_net, what.c_str());
  }
  fsdp_fabric full({}, loom::fsdp(loom::fsdp_options{.state_dict = loom::state_dict_type::full}));
  laws::law_checkpoint_round_trip(full, make_net, "FULL_SHARD, full save");
}

void law_variants() {
  {
    fsdp_fabric fabric({}, loom::fsdp(loom::fsdp_options{.forward_prefetch = false, .backward_prefetch = false}));
    laws::law_equivalence(fabric, make_net, "FULL_SHARD, prefetch off");
  }
  {
    fsdp_fabric fabric({}, loom::fsdp());
    laws::law_equivalence(fabric, make_net, "FULL_SHARD, optimizer built after setup", 20,
                          /*build_optimizer_after_setup=*/true);
  }
  {
    fsdp_fabric fabric({}, loom::fsdp(loom::fsdp_options{
                               .wrap_policy = loom::auto_wrap_policy::types<torch::nn::LinearImpl>()}));
    laws::law_equivalence(fabric, make_plain, "FULL_SHARD, auto_wrap_policy {Linear}");
    // Every Linear became a unit of its own (the root keeps nothing).
  }
  {
    // torch's size_based_auto_wrap_policy: fc1 and fc2 (>= 500 parameters) become units, fc3 (132) stays in the root.
    fsdp_fabric fabric({}, loom::fsdp(loom::fsdp_options{.wrap_policy = loom::auto_wrap_policy::size_based(500)}));
    laws::law_equivalence(fabric, make_plain, "FULL_SHARD, auto_wrap_policy size_based(500)");
  }
  using checkpointed = loom::unit_impl<torch::nn::Linear>;
  {
    fsdp_fabric fabric({}, loom::fsdp(loom::fsdp_options{
                               .activation_checkpointing_types = {std::type_index(typeid(checkpointed))}}));
    laws::law_equivalence(fabric, make_net, "FULL_SHARD, activation checkpointing");
  }
  {
    fsdp_fabric fabric({}, loom::fsdp(loom::fsdp_options{
                               .activation_checkpointing_types = {std::type_index(typeid(checkpointed))},
                               .forward_prefetch = false,
                               .backward_prefetch = false}));
    laws::law_equivalence(fabric, make_net, "FULL_SHARD, activation checkpointing, prefetch off");
  }
}

// Net with a probe at the start of its forward: what the engine issued
// between the root's pre-forward and the first unit's forward.
struct ProbedNetImpl : torch::nn::Module {
  ProbedNetImpl()
      : fc1(register_module("fc1", loom::unit<torch::nn::Linear>(16, 32))),
        fc2(register_module("fc2", loom::unit<torch::nn::Linear>(32, 32))),
        fc3(register_module("fc3", torch::nn::Linear(32, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    if (at_forward_start) at_forward_start();
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  loom::unit<torch::nn::Linear> fc1, fc2;
  torch::nn::Linear fc3;
  std::function<void()> at_forward_start;
};
TORCH_MODULE(ProbedNet);

// The forward's gathers once the order is recorded (step 2 on), prefetch on:
// SHARD_GRAD_OP, whose units keep their gathered storage between steps,
// has every unit's all-gather in flight when the model's forward starts;
// FULL_SHARD has the first unit's only (one ahead: each unit's forward
// issues the next). Both prefetch each of the 2 units once per forward and
// gather the root (fc3, outside the units) for the whole step.
void law_prefetch_schedule() {
  using loom::sharding_strategy;
  for (auto strategy : {sharding_strategy::full_shard, sharding_strategy::shard_grad_op}) {
    const std::string what(loom::to_string(strategy));
    fsdp_fabric fabric({}, loom::fsdp(loom::fsdp_options{.strategy = strategy}));
    torch::manual_seed(0);
    ProbedNet net;
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, optimizer] = fabric.setup(net, sgd);
    const auto& counters = model.session().state()->counters();
    train_steps(fabric, model, optimizer, 0, 1);  // records the forward order
    for (int step = 1; step < 3; ++step) {
      const std::uint64_t before = counters.prefetches;
      std::uint64_t at_start = 0;
      net->at_forward_start = [&] { at_start = counters.prefetches - before; };
      const std::uint64_t gathers_before = counters.all_gathers;
      const int64_t local = global_batch / fabric.world_size();
      const at::Tensor output = model(global_inputs(step).narrow(0, fabric.global_rank() * local, local));
      const std::uint64_t in_forward = counters.prefetches - before;
      const std::uint64_t expected_at_start = strategy == sharding_strategy::shard_grad_op ? 2 : 1;
      LAW_EXPECT(at_start == expected_at_start,
                 "%s step %d: %llu all-gathers in flight when the forward started, expected %llu", what.c_str(),
                 step, static_cast<unsigned long long>(at_start),
                 static_cast<unsigned long long>(expected_at_start));
      LAW_EXPECT(in_forward == 2 && counters.all_gathers - gathers_before == 3,
                 "%s step %d: the forward prefetched %llu times and gathered %llu, for the root and 2 units",
                 what.c_str(),
                 step, static_cast<unsigned long long>(in_forward),
                 static_cast<unsigned long long>(counters.all_gathers - gathers_before));
      optimizer.zero_grad();
      fabric.backward(output.pow(2).mean());
      optimizer.step();
    }
    net->at_forward_start = nullptr;
  }
}

// fsdp_cpu_offload: the offload schedule moves each parameter shard to the
// compute device for every gather and each reduced gradient shard back; on
// cpu the moves are the identity, and training equals fsdp without offload,
// bit for bit.
void law_cpu_offload() {
  constexpr int steps = 5;
  auto train = [](auto fabric_tag) {
    using F = typename decltype(fabric_tag)::type;
    F fabric;
    const int r = fabric.global_rank();
    const int64_t local = global_batch / fabric.world_size();
    auto net = make_net();
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
    auto [model, optimizer] = fabric.setup(net, adam);
    for (int step = 0; step < steps; ++step) {
      optimizer.zero_grad();
      fabric.backward(torch::nn::functional::cross_entropy(model(global_inputs(step).narrow(0, r * local, local)),
                                                           global_targets(step).narrow(0, r * local, local)));
      optimizer.step();
    }
    const auto counters = model.session().state()->counters();
    const auto units = model.session().state()->units().size();
    return std::make_tuple(laws::flat(laws::full_parameters(model, net)), counters, units);
  };
  struct plain { using type = fsdp_fabric; };
  struct offloaded { using type = loom::Fabric<loom::cpu, loom::fsdp_cpu_offload, loom::fp32>; };
  const auto [reference, plain_counts, units] = train(plain{});
  const auto [result, counts, same_units] = train(offloaded{});
  LAW_EXPECT(torch::equal(reference, result), "cpu offload changes training by %.3g",
             (reference - result).abs().max().item<double>());
  LAW_EXPECT(plain_counts.offload_to_device == 0 && plain_counts.offload_to_host == 0, "fsdp without offload moves nothing");
  LAW_EXPECT(counts.offload_to_device == counts.all_gathers && counts.offload_to_host == counts.reduce_scatters,
             "every gather moved a parameter shard (%llu moves, %llu gathers) and every reduction a gradient shard "
             "(%llu, %llu)", static_cast<unsigned long long>(counts.offload_to_device),
             static_cast<unsigned long long>(counts.all_gathers), static_cast<unsigned long long>(counts.offload_to_host),
             static_cast<unsigned long long>(counts.reduce_scatters));
  if (laws::rank_for_messages == 0) {
    std::printf("law (cpu offload): %llu shard moves to the device and %llu back over %d steps of %zu units "
                "(%.1f and %.1f per unit per step); bit for bit as without offload\n",
                static_cast<unsigned long long>(counts.offload_to_device),
                static_cast<unsigned long long>(counts.offload_to_host), steps, units,
                static_cast<double>(counts.offload_to_device) / (steps * units),
                static_cast<double>(counts.offload_to_host) / (steps * units));
    std::fflush(stdout);
  }
}

// bf16-mixed (Lightning's mapping: parameters fp32 under bf16 autocast,
// gradients reduced in bf16) against loom's DDP under the same precision,
// which computes the same per-rank gradients and reduces them in fp32: one
// process is not the reference here, since bf16 matmuls over half the rows
// round differently from one over all of them (measured: 0.07 apart after 20
// Adam steps with FSDP reducing in fp32 too). SGD (lr 0.1), so the update is
// lr x the gradient: reducing in bf16 rounds each averaged gradient once
// (relative 2^-9), 20 steps x 0.1 x |g| (< 0.5) x 2^-9 ~ 2e-3 at most; the
// tolerance is 2e-3 absolute. With mixed_precision.reduce_dtype = float32,
// FSDP and DDP differ only in the order of fp32 additions (1e-5).
void law_bf16_mixed() {
  auto train = [](auto& fabric) {
    const int r = fabric.global_rank();
    const int64_t local = global_batch / fabric.world_size();
    auto net = make_net();
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, optimizer] = fabric.setup(net, sgd);
    for (int step = 0; step < 20; ++step) {
      optimizer.zero_grad();
      fabric.backward(torch::nn::functional::cross_entropy(model(global_inputs(step).narrow(0, r * local, local)),
                                                           global_targets(step).narrow(0, r * local, local)));
      optimizer.step();
    }
    return laws::flat(laws::full_parameters(model, net));
  };
  at::Tensor reference;
  {
    // A DDP Fabric beside loom-run's --strategy fsdp.
    auto ddp = laws::outside_launcher<loom::Fabric<loom::cpu, loom::ddp, loom::bf16_mixed>>();
    reference = train(ddp);
  }
  loom::Fabric<loom::cpu, loom::fsdp, loom::bf16_mixed> bf16_reduce;
  const auto low = train(bf16_reduce);
  loom::Fabric<loom::cpu, loom::fsdp, loom::bf16_mixed> fp32_reduce(
      {}, loom::fsdp(loom::fsdp_options{.mixed_precision = loom::fsdp_mixed_precision{.reduce_dtype = at::kFloat}}));
  const auto high = train(fp32_reduce);
  const double low_difference = (low - reference).abs().max().item<double>();
  const double high_difference = (high - reference).abs().max().item<double>();
  LAW_EXPECT(low_difference <= 2e-3, "bf16-mixed FSDP (bf16 reduction) differs from DDP by %.3g", low_difference);
  LAW_EXPECT(high_difference <= 1e-5, "bf16-mixed FSDP with an fp32 reduction differs from DDP by %.3g",
             high_difference);
  LAW_EXPECT(low_difference > 0, "the bf16 reduction changed nothing: was it used?");
  if (laws::rank_for_messages == 0) {
    std::printf("law (bf16-mixed): after 20 SGD steps, max |fsdp - ddp| = %.3g with gradients reduced in bf16 "
                "(tolerance 2e-3), %.3g with mixed_precision.reduce_dtype = float32 (tolerance 1e-5)\n",
                low_difference, high_difference);
    std::fflush(stdout);
  }
}

// Dropout inside a checkpointed unit: the recomputation restores the RNG
// state, so training equals the same FSDP run without checkpointing, bit for bit.
struct DropBlockImpl : torch::nn::Module {
  DropBlockImpl() : fc(register_module("fc", torch::nn::Linear(16, 32))), drop(register_module("drop", torch::nn::Dropout(0.5))) {}
  at::Tensor forward(const at::Tensor& x) { return drop(torch::relu(fc(x))); }
  torch::nn::Linear fc;
  torch::nn::Dropout drop;
};
struct DropNetImpl : torch::nn::Module {
  DropNetImpl() : block(register_module("block", loom::unit<DropBlockImpl>())), head(register_module("head", torch::nn::Linear(32, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return head(block(x)); }
  loom::unit<DropBlockImpl> block;
  torch::nn::Linear head;
};
TORCH_MODULE(DropNet);

void law_checkpoint_rng() {
  auto train = [](bool checkpoint) {
    fsdp_fabric fabric({}, loom::fsdp());
    const int r = fabric.global_rank();
    const int64_t local = global_batch / fabric.world_size();
    at::manual_seed(3);
    DropNet net;
    net->block->checkpoint_activations(checkpoint);
    torch::optim::SGD sgd(net->parameters(), 0.5);
    auto [model, optimizer] = fabric.setup(net, sgd);
    LAW_EXPECT(model.session().state()->units()[1].checkpoint == checkpoint, "the block's checkpoint flag");
    at::manual_seed(100 + r);  // dropout's stream, the same in both runs
    for (int step = 0; step < 5; ++step) {
      optimizer.zero_grad();
      fabric.backward(torch::nn::functional::cross_entropy(model(global_inputs(step).narrow(0, r * local, local)),
                                                           global_targets(step).narrow(0, r * local, local)));
      optimizer.step();
    }
    return laws::flat(laws::full_parameters(model, net));
  };
  const auto plain = train(false);
  const auto recomputed = train(true);
  LAW_EXPECT(torch::equal(plain, recomputed), "dropout under activation checkpointing differs by %.3g",
             (plain - recomputed).abs().max().item<double>());
  if (laws::rank_for_messages == 0) {
    std::printf("law (checkpoint rng): a checkpointed unit with dropout trains bit for bit as without checkpointing\n");
    std::fflush(stdout);
  }
}

// Under no_backward_sync over 4 micro-batches, the 3 skipped backward passes
// issue no reduce-scatter; the synced one issues one per unit; the result
// equals the full batch.
// An embedding tied to the output layer, each in a unit of its own: the
// weight is flattened once, into the root, with a warning; gradients equal
// single device.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const at::Tensor& tied) : weight(register_parameter("weight", tied)) {}
  at::Tensor forward(const at::Tensor& x) { return x.matmul(weight.t()); }
  at::Tensor weight;
};
struct TiedImpl : torch::nn::Module {
  TiedImpl()
      : embed(register_module("embed", loom::unit<torch::nn::Embedding>(12, 8))),
        body(register_module("body", loom::unit<torch::nn::Linear>(8, 8))),
        head(register_module("head", loom::unit<TiedHeadImpl>(embed->weight))) {}
  at::Tensor forward(const at::Tensor& tokens) { return head(torch::tanh(body(embed(tokens)))); }
  loom::unit<torch::nn::Embedding> embed;
  loom::unit<torch::nn::Linear> body;
  loom::unit<TiedHeadImpl> head;
};
TORCH_MODULE(Tied);

void law_tied() {
  fsdp_fabric fabric({}, loom::fsdp());
  const int r = fabric.global_rank();
  const int w = fabric.world_size();
  auto make = [] {
    at::manual_seed(5);
    return Tied();
  };
  auto net = make();
  auto reference = make();
  LAW_EXPECT(net->head->weight.is_same(net->embed->weight), "the model ties head.weight to embed.weight");
  torch::optim::SGD sgd(net->parameters(), 0.5);
  torch::optim::SGD reference_sgd(reference->parameters(), 0.5);
  auto [model, optimizer] = fabric.setup(net, sgd);
  const auto units = model.session().state()->units();
  LAW_EXPECT(units.front().numel >= 12 * 8, "the tied weight went into the root unit (root has %ld elements)",
             units.front().numel);
  for (int step = 0; step < 5; ++step) {
    auto generator = at::detail::createCPUGenerator(300 + step);
    const auto tokens = at::randint(0, 12, {16}, generator);
    const int64_t local = 16 / w;
    optimizer.zero_grad();
    auto out = model(tokens.narrow(0, r * local, local));
    fabric.backward(torch::nn::functional::cross_entropy(out, tokens.narrow(0, r * local, local)));
    optimizer.step();
    reference_sgd.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(tokens), tokens).backward();
    reference_sgd.step();
  }
  const auto mine = laws::flat(laws::full_parameters(model, net));
  const double max_difference = (mine - laws::flat_of(reference)).abs().max().item<double>();
  LAW_EXPECT(torch::allclose(mine, laws::flat_of(reference), 1e-4, 1e-5),
             "tied weights: FSDP differs from single device by %.3g", max_difference);
  if (r == 0) {
    std::printf("law (tied): embed.weight = head.weight flattened into the root; max |fsdp - single| after 5 SGD "
                "steps = %.3g\n", max_difference);
    std::fflush(stdout);
  }
}

// fabric.init_module(true) (Lightning's empty_init=True) under FULL_SHARD
// and ZeRO-3: each unit keeps only its shard from its constructor on (fc1,
// fc2: placeholders of 4 bytes until setup; fc3, no unit, stays whole in the
// root); after setup the gathered parameters equal one process's, built with
// the same seed, element for element, and training follows the laws; under
// ZeRO-3's bf16 mode the shards are bf16 from construction on, equal to the
// module converted at setup. Where the shards cannot be what setup needs
// (a weight tied across units) setup refuses with what to do; cut for
// FULL_SHARD and set up otherwise, each unit is gathered whole once at
// setup; under SHARD_GRAD_OP init_module(true) has no effect.
template <class F>
std::string setup_refusal(F& fabric, Tied& net) {
  torch::optim::SGD sgd(net->parameters(), 0.5);
  try {
    auto set_up = fabric.setup(net, sgd);
  } catch (const loom::configuration_error& error) {
    return error.what();
  }
  return "(no error)";
}

// HYBRID_SHARD under init_module(true): each unit keeps its shard of the
// world (4 ranks) from its constructor on; setup gathers each unit once and
// shards it over its shard group (2 ranks): the gathered parameters equal
// one process's element for element, and training follows the laws.
void law_hybrid_construction(fsdp_fabric& fabric) {
  auto build = [&] {
    auto guard = fabric.init_module(true);
    return make_net();
  };
  auto net = build();
  for (const auto& p : net->fc1->parameters()) {
    LAW_EXPECT(loom::detail::is_placeholder(p), "HYBRID_SHARD, init_module(true): fc1 keeps %zu bytes, not a "
               "placeholder", p.storage().nbytes());
  }
  auto reference = make_net();
  laws::law_built_as_whole(fabric, net, reference, "HYBRID_SHARD, init_module(true)");
  laws::law_equivalence(fabric, build, make_net, "HYBRID_SHARD, init_module(true)",
                        laws::data_parallel_split(fabric));
  if (fabric.global_rank() == 0) {
    std::printf("law (init_module(true), HYBRID_SHARD): units keep their shard of the world from construction; "
                "setup gathers each once and shards it over the shard group; equal to one process's element for "
                "element\n");
    std::fflush(stdout);
  }
}

// DeepSpeed's bf16 mode under precision P: each shard is bf16 from
// construction on, equal element for element to the module built by the
// same precision's init_module(false) (bf16-true builds in bf16; bf16-mixed
// in fp32) and converted at setup.
template <class P>
void law_sharded_construction_bf16(const char* precision) {
  loom::Fabric<loom::cpu, loom::deepspeed_stage_3, P> zero;
  auto build = [&](bool empty_init) {
    auto guard = zero.init_module(empty_init);
    return make_net();
  };
  auto net = build(true);
  for (const auto& p : net->fc1->parameters()) {
    LAW_EXPECT(p.scalar_type() == at::kBFloat16 && p.storage().nbytes() == 2,
               "ZeRO-3 %s, init_module(true): fc1 keeps a %s placeholder of %zu bytes, not a 2-byte bf16 one",
               precision, c10::toString(p.scalar_type()), p.storage().nbytes());
  }
  auto reference = build(false);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = zero.setup(net, adam);
  const auto gathered = laws::flat(laws::full_parameters(zero, model, net));
  const auto expected = laws::flat_of(reference).to(at::kBFloat16);
  LAW_EXPECT(gathered.scalar_type() == at::kBFloat16 && torch::equal(gathered, expected),
             "ZeRO-3 %s, init_module(true): the gathered parameters differ from the module built whole and "
             "converted by %g",
             precision, (gathered.to(at::kFloat) - expected.to(at::kFloat)).abs().max().template item<double>());
  laws::train_steps(zero, model, optimizer, 0, 3);
  const auto trained = laws::flat(laws::full_parameters(zero, model, net));
  LAW_EXPECT(torch::isfinite(trained.to(at::kFloat)).all().template item<bool>() && !torch::equal(trained, gathered),
             "ZeRO-3 %s, init_module(true): three steps left the parameters unchanged or not finite", precision);
}

void law_sharded_construction() {
  fsdp_fabric fabric({}, loom::fsdp());
  auto build = [&] {
    auto guard = fabric.init_module(true);
    return make_net();
  };
  {
    auto net = build();
    for (const auto* unit : {&net->fc1, &net->fc2}) {
      for (const auto& p : (*unit)->parameters()) {
        LAW_EXPECT(p.storage().nbytes() == sizeof(float),
                   "a unit built under init_module(true) keeps a parameter of %zu bytes, not a 4-byte placeholder",
                   p.storage().nbytes());
      }
    }
    LAW_EXPECT(net->fc3->weight.storage().nbytes() == 32 * 4 * sizeof(float),
               "fc3 (not a unit) is whole until setup: %zu bytes", net->fc3->weight.storage().nbytes());
    auto reference = make_net();
    laws::law_built_as_whole(fabric, net, reference, "FULL_SHARD, init_module(true)");
  }
  laws::law_equivalence(fabric, build, make_net, "FULL_SHARD, init_module(true)", laws::data_parallel_split(fabric));
  {
    loom::Fabric<loom::cpu, loom::deepspeed_stage_3, loom::fp32> zero;
    auto build_zero = [&] {
      auto guard = zero.init_module(true);
      return make_net();
    };
    laws::law_equivalence(zero, build_zero, make_net, "ZeRO-3, init_module(true)", laws::data_parallel_split(zero));
  }
  law_sharded_construction_bf16<loom::bf16_mixed>("bf16-mixed");
  law_sharded_construction_bf16<loom::bf16>("bf16-true");
  {
    auto net = [&] {
      auto guard = fabric.init_module(true);
      at::manual_seed(5);
      return Tied();
    }();
    const std::string refused = setup_refusal(fabric, net);
    LAW_EXPECT(refused.find("init_module(true)") != std::string::npos && refused.find("tied") != std::string::npos,
               "a weight tied across units built under init_module(true): setup said \"%s\"", refused.c_str());
  }
  {
    fsdp_fabric grad_op({}, loom::fsdp(loom::fsdp_options{.strategy = loom::sharding_strategy::shard_grad_op}));
    auto guard = grad_op.init_module(true);
    auto net = make_net();
    LAW_EXPECT(net->fc1->weight.storage().nbytes() == 32 * 16 * sizeof(float),
               "under SHARD_GRAD_OP init_module(true) has no effect: fc1.weight holds %zu bytes",
               net->fc1->weight.storage().nbytes());
  }
  {
    // Cut for FULL_SHARD, set up under SHARD_GRAD_OP (which keeps whole
    // parameters): setup gathers each unit once, and the module is the one
    // built whole.
    fsdp_fabric grad_op({}, loom::fsdp(loom::fsdp_options{.strategy = loom::sharding_strategy::shard_grad_op}));
    auto net = build();
    auto reference = make_net();
    laws::law_built_as_whole(grad_op, net, reference, "built under FULL_SHARD's init_module(true), set up under "
                             "SHARD_GRAD_OP");
  }
  if (fabric.global_rank() == 0) {
    std::printf("law (init_module(true)): FULL_SHARD and ZeRO-3 units keep only their shards from construction; "
                "gathered after setup they equal one process's element for element (ZeRO-3 under bf16-mixed and "
                "bf16-true: bf16 shards, equal to the module built whole and converted); a tied weight is refused; "
                "set up under SHARD_GRAD_OP each unit is gathered whole at setup, equal element for element\n");
    std::fflush(stdout);
  }
}

// Tried as a new user would: the tied model, Adam over net->parameters()
// (which lists the tied weight twice in LibTorch), a full save between
// steps. Training goes on as without the save, and equals single device.
void law_tied_full_save() {
  fsdp_fabric fabric({}, loom::fsdp(loom::fsdp_options{.state_dict = loom::state_dict_type::full}));
  const int r = fabric.global_rank();
  const int w = fabric.world_size();
  auto make = [] {
    at::manual_seed(5);
    return Tied();
  };
  auto net = make();
  auto reference = make();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  const std::string path = test_dir() + "/tied_full_" + std::to_string(w) + ".ckpt";
  std::string failure;
  for (int step = 0; step < 4; ++step) {
    auto generator = at::detail::createCPUGenerator(400 + step);
    const auto tokens = at::randint(0, 12, {16}, generator);
    const int64_t local = 16 / w;
    try {
      optimizer.zero_grad();
      fabric.backward(torch::nn::functional::cross_entropy(model(tokens.narrow(0, r * local, local)),
                                                           tokens.narrow(0, r * local, local)));
      optimizer.step();
      if (step == 1) fabric.save(path, {{"model", model}, {"optimizer", optimizer}});
    } catch (const std::exception& error) {
      if (failure.empty()) failure = "step " + std::to_string(step) + ": " + error.what();
    }
    reference_adam.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(tokens), tokens).backward();
    reference_adam.step();
  }
  LAW_EXPECT(failure.empty(), "tied weights, full save: %s", failure.c_str());
  const auto mine = laws::flat(laws::full_parameters(model, net));
  const double max_difference = (mine - laws::flat_of(reference)).abs().max().item<double>();
  LAW_EXPECT(torch::allclose(mine, laws::flat_of(reference), 1e-4, 1e-5),
             "tied weights, full save: FSDP differs from single device by %.3g", max_difference);
  if (r == 0) {
    std::printf("law (tied, full save): Adam over net->parameters() (the tied weight listed twice), a full save after "
                "step 2 of 4: max |fsdp - single| = %.3g\n", max_difference);
    std::fflush(stdout);
  }
}

// A sharded checkpoint (the default): save then load on the same ranks goes
// on bit for bit; the same state is then written sharded and full for the
// resharding and consolidation checks (fsdp.sh), with the gathered
// parameters as the expected values.
void law_sharded_checkpoint() {
  fsdp_fabric fabric({}, loom::fsdp());
  const int r = fabric.global_rank();
  const int w = fabric.world_size();
  const std::string path = test_dir() + "/sharded_" + std::to_string(w);
  auto net = make_net();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  train_steps(fabric, model, optimizer, 0, 3);
  fabric.save(path, {{"model", model}, {"optimizer", optimizer}, {"step", 3}});
  const auto saved = laws::flat(laws::full_parameters(model, net));
  train_steps(fabric, model, optimizer, 3, 6);
  const auto continued = laws::flat(laws::full_parameters(model, net));
  LAW_EXPECT(loom::is_sharded_checkpoint(path), "the default save wrote a sharded directory");
  fabric.load(path, {{"model", model}, {"optimizer", optimizer}});
  LAW_EXPECT(torch::equal(laws::flat(laws::full_parameters(model, net)), saved), "the sharded checkpoint loads back");
  train_steps(fabric, model, optimizer, 3, 6);
  const auto again = laws::flat(laws::full_parameters(model, net));
  LAW_EXPECT(torch::equal(again, continued), "training after a sharded load differs by %.3g",
             (again - continued).abs().max().item<double>());
  // Saving over an existing sharded checkpoint replaces it (RENAME_EXCHANGE).
  fabric.save(path, {{"model", model}, {"optimizer", optimizer}, {"step", 6}});
  fabric.strategy().set_state_dict_type(loom::state_dict_type::full);
  fabric.save(path + ".full", {{"model", model}, {"optimizer", optimizer}, {"step", 6}});
  const auto expected = laws::full_parameters(model, net);  // a collective: every rank
  if (r == 0) {
    torch::save(expected, path + ".expected");
    std::printf("law (sharded checkpoint): %d rank files + meta.pt; loads back on %d ranks and continues bit for "
                "bit; saved again over itself\n", w, w);
    std::fflush(stdout);
  }
  fabric.barrier();
}

// One unit over the whole model (no wrap policy): fc1.weight lies wholly in
// rank 0's part of the flat buffer, so rank 1's file holds an empty range for
// it, and rank 0's optimizer state for it must come back flat after a load.
// A sharded save, a load and three more Adam steps equal training on.
void law_sharded_one_unit() {
  fsdp_fabric fabric({}, loom::fsdp());
  const std::string path = test_dir() + "/one_unit_" + std::to_string(fabric.world_size());
  auto net = make_plain();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  train_steps(fabric, model, optimizer, 0, 3);
  fabric.save(path, {{"model", model}, {"optimizer", optimizer}});
  const auto saved = laws::flat(laws::full_parameters(model, net));
  train_steps(fabric, model, optimizer, 3, 6);
  const auto continued = laws::flat(laws::full_parameters(model, net));
  fabric.load(path, {{"model", model}, {"optimizer", optimizer}});
  LAW_EXPECT(torch::equal(laws::flat(laws::full_parameters(model, net)), saved),
             "one unit: the sharded checkpoint loads back");
  train_steps(fabric, model, optimizer, 3, 6);
  const auto again = laws::flat(laws::full_parameters(model, net));
  LAW_EXPECT(torch::equal(again, continued), "one unit: training after a sharded load differs by %.3g",
             (again - continued).abs().max().item<double>());
  if (fabric.global_rank() == 0) {
    std::printf("law (sharded checkpoint, one unit): a parameter wholly in one rank's part saves, loads and "
                "trains on bit for bit\n");
    std::fflush(stdout);
  }
}

// Loads a sharded checkpoint written on another number of ranks (fsdp.sh:
// from 2 onto 4 here, and onto 1 with single_device): the parameters equal
// the gathered ones the writer recorded, bit for bit, and training goes on.
void law_reshard(const std::string& from) {
  std::vector<at::Tensor> expected;
  torch::load(expected, from + ".expected");
  auto compare = [&](const std::vector<at::Tensor>& got, const char* where) {
    bool same = got.size() == expected.size();
    for (std::size_t k = 0; same && k < got.size(); ++k) same = torch::equal(got[k], expected[k]);
    LAW_EXPECT(same, "%s: the resharded parameters differ from the ones saved", where);
  };
  fsdp_fabric fabric({}, loom::fsdp());
  auto net = make_net();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  // The full save of the same state, from 2 ranks, on this many.
  fabric.load(from + ".full", {{"model", model}, {"optimizer", optimizer}});
  compare(laws::full_parameters(model, net), "fsdp, full checkpoint");
  auto rest = fabric.load(from, {{"model", model}, {"optimizer", optimizer}});
  compare(laws::full_parameters(model, net), "fsdp");
  LAW_EXPECT(rest.get<int>("step") == 6, "the step entry came back as %d", rest.get<int>("step"));
  train_steps(fabric, model, optimizer, 6, 8);  // the loaded optimizer state has the shards' shapes
  if (fabric.global_rank() == 0) {
    auto single = laws::outside_launcher<loom::Fabric<loom::cpu, loom::single_device>>();
    auto fresh = make_net();
    torch::optim::Adam fresh_adam(fresh->parameters(), torch::optim::AdamOptions(1e-2));
    auto [fresh_model, fresh_optimizer] = single.setup(fresh, fresh_adam);
    single.load(from, {{"model", fresh_model}, {"optimizer", fresh_optimizer}});
    std::vector<at::Tensor> got;
    for (const auto& p : fresh->parameters()) got.push_back(p.detach());
    compare(got, "single_device");
    std::printf("law (reshard): the sharded checkpoint %s (and the full one of the same state) loads on %d ranks "
                "and on single_device, bit for bit\n",
                from.c_str(), fabric.world_size());
    std::fflush(stdout);
  }
}

// A sharded checkpoint with one tensor record of rank 1's file corrupted
// (fsdp.sh damages a copy of the 2-rank save): rank 1 finds it by the
// record's CRC32 as it reads its part; rank 0, which reads nothing of that
// file's tensors, learns it before anything is loaded. Both throw, naming
// what failed, and keep their parameters and optimizer state.
void law_damaged_part(const std::string& path) {
  fsdp_fabric fabric({}, loom::fsdp());
  const int r = fabric.global_rank();
  auto net = make_net();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  train_steps(fabric, model, optimizer, 0, 2);
  auto held = [&] {  // this rank's parts and its Adam state
    std::vector<at::Tensor> out;
    for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
    for (const auto& p : net->parameters()) {
      const auto& state = static_cast<const torch::optim::AdamParamState&>(*adam.state().at(
          loom::compat::optimizer_state_key(p)));
      out.push_back(state.exp_avg().clone());
      out.push_back(state.exp_avg_sq().clone());
    }
    return out;
  };
  const auto before = held();
  std::string message;
  try {
    fabric.load(path, {{"model", model}, {"optimizer", optimizer}});
  } catch (const loom::checkpoint_error& error) {
    message = error.what();
  }
  const std::string expected = r == 1 ? "is corrupted (CRC32 mismatch) in record" : "rank(s) 1 could not read or check their part";
  LAW_EXPECT(message.find(expected) != std::string::npos, "rank %d: expected an error naming '%s', got '%s'", r,
             expected.c_str(), message.c_str());
  const auto after = held();
  bool unchanged = before.size() == after.size();
  for (std::size_t k = 0; unchanged && k < before.size(); ++k) unchanged = torch::equal(before[k], after[k]);
  LAW_EXPECT(unchanged, "rank %d: the failed load changed its parameters or optimizer state", r);
  std::printf("law (damaged part) rank %d: refused, state unchanged: %s\n", r, message.c_str());
  std::fflush(stdout);
  fabric.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::string(argv[1]) == "load_check") return laws::load_check(argv[2]);
  if (argc > 3 && std::string(argv[1]) == "load_damaged") return laws::load_damaged(argv[2], argv[3]);
  using loom::sharding_strategy;
  const auto every_strategy = {sharding_strategy::full_shard, sharding_strategy::shard_grad_op,
                               sharding_strategy::no_shard};
  auto make_launcher = [](const std::string& scenario, int devices) {
    // HYBRID_SHARD: the launcher is the Fabric under test (one per process:
    // the nodes meet through one TCP store on MASTER_PORT, which a second
    // Fabric cannot host again).
    if (scenario == "hybrid") {
      return fsdp_fabric({.devices = loom::devices_spec(devices), .num_nodes = 2},
                         loom::fsdp(loom::fsdp_options{.strategy = sharding_strategy::hybrid_shard}));
    }
    return fsdp_fabric({.devices = loom::devices_spec(devices)});
  };
  return laws::worker_main<fsdp_fabric>(
      argc, argv, "fsdp laws", make_launcher,
      {{"laws",
        [&](fsdp_fabric&) {
          law_strategies(every_strategy);
          law_variants();
          law_prefetch_schedule();
          law_checkpoint_rng();
          law_cpu_offload();
          law_bf16_mixed();
          law_tied();
          law_tied_full_save();
          law_sharded_checkpoint();
          law_sharded_one_unit();
          law_sharded_construction();
        }},
       {"construction", [](fsdp_fabric&) { law_sharded_construction(); }},
       {"laws_short", [&](fsdp_fabric&) { law_strategies(every_strategy); }},
       {"lifetimes",
        [&](fsdp_fabric&) {
          for (auto strategy : every_strategy) {
            const std::string what(loom::to_string(strategy));
            fsdp_fabric fabric({}, loom::fsdp(loom::fsdp_options{.strategy = strategy}));
            laws::law_failed_step(fabric, laws::make_failing, what.c_str());
            laws::law_module_outlived(fabric, make_net, what.c_str());
          }
        }},
       {"tied",
        [](fsdp_fabric&) {
          law_tied();
          law_tied_full_save();
        }},
       {"bf16", [](fsdp_fabric&) { law_bf16_mixed(); }},
       {"reshard", [](fsdp_fabric&) { law_reshard(test_dir() + "/sharded_2"); }},
       {"damaged_part", [](fsdp_fabric&) { law_damaged_part(test_dir() + "/damaged_part"); }},
       {"hybrid",
        [](fsdp_fabric& fabric) {
          LAW_EXPECT(fabric.world_size() == 4, "HYBRID_SHARD runs on 2 nodes x 2 ranks, not %d ranks",
                     fabric.world_size());
          const char* what = "HYBRID_SHARD (replicate=2, shard=2)";
          law_hybrid_construction(fabric);
          laws::law_equivalence(fabric, make_net, what);
          laws::law_gradient_norm(fabric, make_net, what);
          laws::law_accumulation(fabric, make_net, what);
          laws::law_checkpoint_round_trip(fabric, make_net, what);
          laws::law_failed_step(fabric, laws::make_failing, what);
        }},
       {"save_forever",
        [](fsdp_fabric&) {
          fsdp_fabric fabric({}, loom::fsdp());  // sharded saves
          laws::save_forever(fabric);
        }}},
      {"save_forever"});
}
