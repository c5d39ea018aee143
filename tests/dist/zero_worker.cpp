// ZeRO's laws on real processes (tests/dist/zero.sh): stages 0 to 3
// against single_device through the shared laws of strategy_laws.hpp; the
// DeepSpeed engine semantics of gradient_accumulation_steps and
// gradient_clipping from a JSON config; stages 1 and 2 against loom's DDP;
// what each stage keeps per rank. `zero_worker laws N` starts N ranks itself.
#include "law_models.hpp"

#include <loom/strategy/nvme_stream.hpp>  // the NVMe stream's counters
#include <loom/strategy/zero_config.hpp>  // the resolved DeepSpeed configuration

#include <ATen/core/grad_mode.h>
#include <torch/optim/adamw.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using laws::global_batch;
using laws::global_inputs;
using laws::global_targets;

using laws::make_net;
using laws::make_plain;
using laws::test_dir;
using laws::train_steps;

using zero_fabric = loom::Fabric<loom::cpu, loom::deepspeed, loom::fp32>;

loom::deepspeed stage(int s) { return loom::deepspeed(loom::deepspeed_options{.stage = s}); }

// Stage 3 with the optimizer state (and, with parameters, the parameter
// partitions) on NVMe under TEST_DIR/nvme, in sub-groups of 64 elements.
loom::deepspeed_options nvme_options(bool parameters) {
  return loom::deepspeed_options{.stage = 3,
                                 .offload_optimizer = true,
                                 .offload_parameters = parameters,
                                 .offload_params_device = parameters ? "nvme" : "cpu",
                                 .offload_optimizer_device = "nvme",
                                 .nvme_path = test_dir() + "/nvme",
                                 .block_size = 4096,
                                 .queue_depth = 4,
                                 .sub_group_size = 64};
}

void law_stages() {
  for (int s : {0, 1, 2, 3}) {
    zero_fabric fabric({}, stage(s));
    laws::law_equivalence(fabric, make_net, ("ZeRO stage " + std::to_string(s)).c_str());
    laws::law_gradient_norm(fabric, make_net, ("ZeRO stage " + std::to_string(s)).c_str());
    laws::law_accumulation(fabric, make_net, ("ZeRO stage " + std::to_string(s)).c_str());
    laws::law_checkpoint_round_trip(fabric, make_net, ("ZeRO stage " + std::to_string(s)).c_str());
    laws::law_zero_grad(fabric, make_net, ("ZeRO stage " + std::to_string(s)).c_str());
    laws::law_failed_step(fabric, laws::make_failing, ("ZeRO stage " + std::to_string(s)).c_str());
    laws::law_module_outlived(fabric, make_net, ("ZeRO stage " + std::to_string(s)).c_str());
  }
  {
    zero_fabric fabric({}, stage(3));
    laws::law_equivalence(fabric, make_plain, "ZeRO stage 3, no units (the model is one bucket)");
  }
  {
    zero_fabric fabric({}, loom::deepspeed(loom::deepspeed_options{.stage = 2, .overlap_comm = false}));
    laws::law_equivalence(fabric, make_net, "ZeRO stage 2, overlap_comm false");
  }
  {
    // reduce_bucket_size 500: fc1 (544 parameters) and fc2 (1056) become buckets of their own.
    zero_fabric fabric({}, loom::deepspeed(loom::deepspeed_options{.stage = 2, .reduce_bucket_size = 500}));
    laws::law_equivalence(fabric, make_plain, "ZeRO stage 2, reduce_bucket_size 500");
  }
  {
    zero_fabric fabric({}, loom::deepspeed_stage_2_offload());
    laws::law_equivalence(fabric, make_net, "deepspeed_stage_2_offload (cpu)");
  }
  {
    zero_fabric fabric({}, loom::deepspeed_stage_3_offload());
    laws::law_equivalence(fabric, make_net, "deepspeed_stage_3_offload (cpu)");
  }
}

// DeepSpeed's engine semantics from a JSON file: every micro-batch the user
// calls zero_grad, backward and step; backward scales the loss by 1/k and
// reduces on the boundary micro-batch only; step clips to gradient_clipping
// and steps on every k-th call. Against one process taking the whole batch,
// clipping to the same norm, 20 Adam steps. Every rank holds the same
// parameters after each boundary. The tolerance is the shared one: the same
// terms are summed in another order (per micro-batch, then across ranks).
// set_to_none: the user zeroes with optimizer.zero_grad(set_to_none), which
// must keep the micro-batches' gradients as zero_grad() does (it went past
// the strategy before, straight to LibTorch).
void law_accumulation_from_json(int s, bool through_environment, std::optional<bool> set_to_none = std::nullopt) {
  constexpr int k = 4;
  constexpr int steps = 20;
  constexpr double max_norm = 1.0;
  int world = 0;
  std::string path;
  {
    zero_fabric probe;  // the world size, for the config's batch sizes
    world = probe.world_size();
    path = test_dir() + "/ds_config_stage" + std::to_string(s) + "_" + std::to_string(probe.global_rank()) + ".json";
  }
  const int64_t micro = global_batch / (k * world);
  {
    std::ofstream out(path);
    out << "{\n  \"train_batch_size\": " << global_batch << ",\n  \"train_micro_batch_size_per_gpu\": " << micro
        << ",\n  \"gradient_accumulation_steps\": " << k << ",\n  \"gradient_clipping\": " << max_norm
        << ",\n  \"zero_optimization\": {\"stage\": " << s
        << ", \"overlap_comm\": true, \"contiguous_gradients\": true},\n  \"steps_per_print\": 2000\n}\n";
  }
  loom::deepspeed_options options;
  if (through_environment) ::setenv("PL_DEEPSPEED_CONFIG_PATH", path.c_str(), 1);
  else options.config = path;
  zero_fabric fabric({}, loom::deepspeed(options));
  ::unsetenv("PL_DEEPSPEED_CONFIG_PATH");
  const int r = fabric.global_rank();
  LAW_EXPECT(fabric.strategy().config().gradient_accumulation_steps == k, "the config's accumulation was not read");
  LAW_EXPECT(fabric.strategy().config().gradient_clipping == max_norm, "the config's clipping was not read");

  auto net = make_net();
  auto reference = make_net();
  const auto adam_options = torch::optim::AdamOptions(1e-2);
  torch::optim::Adam reference_adam(reference->parameters(), adam_options);
  torch::optim::Adam adam(net->parameters(), adam_options);
  auto [model, optimizer] = fabric.setup(net, adam);
  bool refused_clip = false;
  for (int step = 0; step < steps; ++step) {
    const auto x = global_inputs(step);
    const auto y = global_targets(step);
    for (int m = 0; m < k; ++m) {
      if (set_to_none) optimizer.zero_grad(*set_to_none);
      else optimizer.zero_grad();
      const int64_t begin = (m * world + r) * micro;
      fabric.backward(torch::nn::functional::cross_entropy(model(x.narrow(0, begin, micro)), y.narrow(0, begin, micro)));
      if (step == 0 && m == k - 1) {
        try {
          (void)fabric.clip_gradients(model, optimizer, loom::clip_options{.max_norm = 1.0});
        } catch (const loom::configuration_error& error) {
          refused_clip = std::string(error.what()).find("gradient_clipping") != std::string::npos;
        }
      }
      optimizer.step();
    }
    LAW_EXPECT(fabric.strategy().micro_steps() == (step + 1) * k, "micro_steps %ld after %d steps",
               static_cast<long>(fabric.strategy().micro_steps()), step + 1);
    reference_adam.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    torch::nn::utils::clip_grad_norm_(reference->parameters(), max_norm);
    reference_adam.step();
    const auto mine = laws::flat(laws::full_parameters(model, net));
    const auto everyone = fabric.all_gather(mine);
    for (int other = 1; other < world; ++other) {
      LAW_EXPECT(torch::equal(everyone[0], everyone[other]), "stage %d step %d: rank %d differs", s, step, other);
    }
  }
  LAW_EXPECT(refused_clip, "fabric.clip_gradients beside the config's gradient_clipping was not refused");
  const auto counters = model.session().state()->counters();
  const auto units = model.session().state()->units().size();
  const auto strategy = laws::flat(laws::full_parameters(model, net));
  const double difference = (strategy - laws::flat_of(reference)).abs().max().item<double>();
  laws::tolerance allowed;
  LAW_EXPECT(torch::allclose(strategy, laws::flat_of(reference), allowed.rtol, allowed.atol),
             "stage %d with gradient_accumulation_steps %d differs from one process by %.3g", s, k, difference);
  // Reductions on boundary micro-batches only: one per unit per step.
  const auto reductions = counters.reduce_scatters + counters.all_reduces;
  LAW_EXPECT(reductions == static_cast<std::uint64_t>(steps) * units,
             "stage %d: %llu reductions over %d steps of %zu units (%d micro-batches each): expected one per unit "
             "per step", s, static_cast<unsigned long long>(reductions), steps, units, k);
  if (r == 0) {
    std::printf("law (accumulation, %s%s): stage %d, gradient_accumulation_steps %d and gradient_clipping %.1f from "
                "JSON: max |zero - single| after %d Adam steps = %.3g (rtol %g, atol %g); %llu reductions for %d "
                "micro-batches x %zu units; fabric.clip_gradients refused beside gradient_clipping\n",
                through_environment ? "PL_DEEPSPEED_CONFIG_PATH" : "config path",
                !set_to_none ? "" : *set_to_none ? ", zero_grad(true)" : ", zero_grad(false)", s, k, max_norm, steps,
                difference,
                allowed.rtol, allowed.atol, static_cast<unsigned long long>(reductions), steps * k, units);
    std::fflush(stdout);
  }
}

// Stages 1 and 2 against loom's DDP with Adam: on 2 ranks both average each
// gradient as (a + b) / 2 and Adam is elementwise, so they are bit-identical
// (PyTorch's ZeroRedundancyOptimizer is bit-identical to DDP there too). On
// 4 ranks the reduce-scatter and DDP's all-reduce add the four terms in
// different orders: within the shared tolerance.
void law_against_ddp() {
  auto train = [](auto& fabric) {
    auto net = make_net();
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
    auto [model, optimizer] = fabric.setup(net, adam);
    train_steps(fabric, model, optimizer, 0, 20);
    return laws::flat(laws::full_parameters(model, net));
  };
  at::Tensor reference;
  int world = 0;
  {
    auto ddp = laws::outside_launcher<loom::Fabric<loom::cpu, loom::ddp, loom::fp32>>();
    world = ddp.world_size();
    reference = train(ddp);
  }
  for (int s : {1, 2}) {
    zero_fabric fabric({}, stage(s));
    const auto result = train(fabric);
    const double difference = (result - reference).abs().max().item<double>();
    if (world == 2) {
      LAW_EXPECT(torch::equal(result, reference), "stage %d differs from DDP by %.3g on 2 ranks", s, difference);
    } else {
      LAW_EXPECT(torch::allclose(result, reference, 1e-4, 2e-5), "stage %d differs from DDP by %.3g", s, difference);
    }
    if (laws::rank_for_messages == 0) {
      std::printf("law (against DDP): stage %d with Adam, 20 steps on %d ranks: max |zero - ddp| = %.3g (%s)\n", s,
                  world, difference, world == 2 ? "required bit-identical" : "tolerance rtol 1e-4, atol 2e-5");
      std::fflush(stdout);
    }
  }
}

// DeepSpeed's bf16 mode (bf16-mixed): the module in bf16 without autocast,
// gradients reduced in fp32, each rank stepping an fp32 master of its
// partition with fp32 Adam state. Stages 1, 2 and 3 compute the same
// gradients through the same fp32 reduction, so they agree bit for bit; and
// so does one process running that recipe by hand: each rank's rows through
// the bf16 module, the bf16 gradients summed in fp32 in rank order and
// divided by N (the reduce-scatter's order), the mean stored in bf16 (the
// gradient partition), fp32 Adam on fp32 masters, the result cast to bf16.
void law_bf16() {
  constexpr int steps = 20;
  auto train = [](auto& fabric) {
    auto net = make_net();
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
    auto [model, optimizer] = fabric.setup(net, adam);
    LAW_EXPECT(net->fc1->weight.scalar_type() == at::kBFloat16, "the module is not bf16 under ZeRO's bf16 mode");
    train_steps(fabric, model, optimizer, 0, steps);
    for (const auto& [key, per_parameter] : adam.state()) {
      const auto& st = static_cast<const torch::optim::AdamParamState&>(*per_parameter);
      LAW_EXPECT(st.exp_avg().scalar_type() == at::kFloat, "Adam's state is not fp32 under bf16");
    }
    return std::make_pair(laws::flat(laws::full_parameters(model, net)), fabric.strategy().master_bytes());
  };
  std::vector<at::Tensor> results;
  for (int s : {1, 2, 3}) {
    loom::Fabric<loom::cpu, loom::deepspeed, loom::bf16_mixed> fabric({}, stage(s));
    auto [result, masters] = train(fabric);
    LAW_EXPECT(masters > 0, "stage %d keeps no fp32 master", s);
    results.push_back(result.to(at::kFloat));
  }
  LAW_EXPECT(torch::equal(results[0], results[1]) && torch::equal(results[0], results[2]),
             "bf16 stages differ: |1-2| = %.3g, |1-3| = %.3g", (results[0] - results[1]).abs().max().item<double>(),
             (results[0] - results[2]).abs().max().item<double>());
  // The recipe by hand on one process, rank by rank.
  const int world = laws::outside_launcher<zero_fabric>().world_size();
  const int64_t local = global_batch / world;
  auto reference = make_net();
  loom::convert_module_floating(*reference, at::kBFloat16);
  std::vector<at::Tensor> masters;
  for (const auto& p : reference->parameters()) masters.push_back(p.detach().to(at::kFloat).requires_grad_(true));
  torch::optim::Adam adam(masters, torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < steps; ++step) {
    std::vector<at::Tensor> sums(masters.size());
    for (int r = 0; r < world; ++r) {
      for (auto& p : reference->parameters()) p.mutable_grad().reset();
      const auto x = global_inputs(step).narrow(0, r * local, local).to(at::kBFloat16);
      const auto logits = reference->forward(x).to(at::kFloat);
      torch::nn::functional::cross_entropy(logits, global_targets(step).narrow(0, r * local, local)).backward();
      std::size_t k = 0;
      for (auto& p : reference->parameters()) {
        const auto g = p.grad().to(at::kFloat);
        sums[k] = r == 0 ? g.clone() : sums[k].add_(g);
        ++k;
      }
    }
    // The reduced gradient is stored in the bf16 partition (2 bytes per parameter), then read in fp32.
    for (std::size_t k = 0; k < masters.size(); ++k) {
      masters[k].mutable_grad() = sums[k].div_(world).to(at::kBFloat16).to(at::kFloat);
    }
    adam.step();
    at::NoGradGuard no_grad;
    std::size_t k = 0;
    for (auto& p : reference->parameters()) p.copy_(masters[k++]);
  }
  const double difference = (results[0] - laws::flat_of(reference).to(at::kFloat)).abs().max().item<double>();
  LAW_EXPECT(difference == 0, "bf16 ZeRO differs from the one-process recipe by %.3g", difference);
  if (laws::rank_for_messages == 0) {
    std::printf("law (bf16): stages 1, 2, 3 under bf16-mixed agree bit for bit; bf16 module, fp32 masters and Adam "
                "state; max |zero - the recipe by hand on one process| after %d Adam steps = %.3g (required 0)\n",
                steps, difference);
    std::fflush(stdout);
  }
}

// The config's gradient_clipping (DeepSpeed's 2-norm, inside step) under
// bf16, whose fp32 masters it clips: a NaN in the last rank's rows raises
// single_device's error on every rank and the parameters stay as they were
// (before, the coefficient was taken as 1 and the step went on with NaN).
void law_config_clipping_nonfinite() {
  loom::Fabric<loom::cpu, loom::deepspeed, loom::bf16_mixed> fabric(
      {}, loom::deepspeed(loom::deepspeed_options{.config = R"({"zero_optimization": {"stage": 2}, "gradient_clipping": 0.05})"}));
  auto net = make_net();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  const laws::batch_split split = laws::data_parallel_split(fabric);
  at::Tensor x = global_inputs(0);
  x.narrow(0, global_batch - 1, 1).fill_(std::numeric_limits<float>::quiet_NaN());
  optimizer.zero_grad();
  fabric.backward(torch::nn::functional::cross_entropy(model(split.rows(x)), split.rows(global_targets(0))));
  const at::Tensor before = laws::flat(laws::full_parameters(model, net));
  std::string raised = "(no error)";
  try {
    optimizer.step();
  } catch (const c10::Error& error) {
    raised = error.what_without_backtrace();
  }
  LAW_EXPECT(raised.find("The total norm of order 2 for gradients from `parameters` is non-finite") == 0,
             "gradient_clipping over a NaN gradient: %s", raised.c_str());
  LAW_EXPECT(torch::equal(laws::flat(laws::full_parameters(model, net)), before),
             "a refused step changed the parameters");
  if (laws::rank_for_messages == 0) {
    std::printf("law (config clipping, NaN): bf16 stage 2 with gradient_clipping 0.05: a NaN gradient raises "
                "torch's error in step on every rank, parameters unchanged\n");
    std::fflush(stdout);
  }
}

// A GAN's two models, each with its own optimizer: the generator (Net,
// 16 -> 4) and a discriminator over its output. Rank r's rows of each batch.
struct CriticImpl : torch::nn::Module {
  CriticImpl() : fc1(register_module("fc1", torch::nn::Linear(4, 8))), fc2(register_module("fc2", torch::nn::Linear(8, 2))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Critic);
Critic make_critic() {
  at::manual_seed(11);
  return Critic();
}

// steps of: the critic on the generator's detached output, then the
// generator through the critic. fabric_g and fabric_d may be one Fabric.
// Returns both models' full parameters, the generator's first.
template <class FG, class FD, class After>
at::Tensor train_gan(FG& fabric_g, FD& fabric_d, int steps, After&& after) {
  auto generator = make_net();
  auto critic = make_critic();
  torch::optim::Adam adam_g(generator->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam adam_d(critic->parameters(), torch::optim::AdamOptions(1e-2));
  auto [g, opt_g] = fabric_g.setup(generator, adam_g);
  auto [d, opt_d] = fabric_d.setup(critic, adam_d);
  const laws::batch_split split = laws::data_parallel_split(fabric_g);
  for (int step = 0; step < steps; ++step) {
    const at::Tensor x = split.rows(global_inputs(step));
    const at::Tensor label = split.rows(global_targets(step)).remainder(2);
    opt_d.zero_grad();
    fabric_d.backward(torch::nn::functional::cross_entropy(d(g(x).detach()), label));
    opt_d.step();
    opt_g.zero_grad();
    fabric_g.backward(torch::nn::functional::cross_entropy(d(g(x)), 1 - label));
    opt_g.step();
  }
  LAW_EXPECT(fabric_g.strategy().micro_steps(opt_g.optimizer()) == steps &&
                 fabric_d.strategy().micro_steps(opt_d.optimizer()) == steps,
             "each model counts its own micro-steps: %ld and %ld after %d steps each",
             static_cast<long>(fabric_g.strategy().micro_steps(opt_g.optimizer())),
             static_cast<long>(fabric_d.strategy().micro_steps(opt_d.optimizer())), steps);
  after(g, opt_g, d, opt_d);
  return at::cat({laws::flat(laws::full_parameters(g, generator)), laws::flat(laws::full_parameters(d, critic))})
      .to(at::kFloat);
}
template <class FG, class FD>
at::Tensor train_gan(FG& fabric_g, FD& fabric_d, int steps) {
  return train_gan(fabric_g, fabric_d, steps, [](auto&...) {});
}

// Two models on one Fabric keep their own engine state (micro-steps, fp32
// masters, clipping): under bf16 with gradient_clipping the pair on one
// Fabric equals each model on a Fabric of its own bit for bit (before, one
// model's step clipped by the norm of both models' masters); in fp32 stage 2
// it equals single_device. A second model where backward would need to know
// the model (gradient_accumulation_steps > 1, fp16, NVMe) is refused.
void law_two_models() {
  constexpr int steps = 6;
  using bf16_fabric = loom::Fabric<loom::cpu, loom::deepspeed, loom::bf16_mixed>;
  const auto clipped = [] {
    return loom::deepspeed(loom::deepspeed_options{
        .config = R"({"zero_optimization": {"stage": 2}, "gradient_clipping": 0.05})"});
  };
  bf16_fabric one({}, clipped());
  const at::Tensor together = train_gan(one, one, steps);
  bf16_fabric for_g({}, clipped());
  bf16_fabric for_d({}, clipped());
  const at::Tensor apart = train_gan(for_g, for_d, steps);
  const double bf16_difference = (together - apart).abs().max().item<double>();
  LAW_EXPECT(bf16_difference == 0, "bf16, gradient_clipping: two models on one Fabric differ from one Fabric each "
             "by %.3g", bf16_difference);

  zero_fabric fp32({}, stage(2));
  // Both in one sharded save: their parameters' names (fc1.weight, ...)
  // would key each other's slices; refused, naming one.
  std::string save_refusal = "(saved)";
  const at::Tensor zero = train_gan(fp32, fp32, steps, [&](auto& g, auto& opt_g, auto& d, auto& opt_d) {
    try {
      fp32.save(test_dir() + "/two_models", {{"g", g}, {"opt_g", opt_g}, {"d", d}, {"opt_d", opt_d}});
    } catch (const loom::configuration_error& error) {
      save_refusal = error.what();
    }
  });
  LAW_EXPECT(save_refusal.find("two modules in this checkpoint have a parameter named 'fc1.weight'") !=
                 std::string::npos,
             "a save of both models: %s", save_refusal.c_str());
  const at::Tensor single = [&] {
    // The same loop on the whole batch: one process.
    auto generator = make_net();
    auto critic = make_critic();
    torch::optim::Adam adam_g(generator->parameters(), torch::optim::AdamOptions(1e-2));
    torch::optim::Adam adam_d(critic->parameters(), torch::optim::AdamOptions(1e-2));
    for (int step = 0; step < steps; ++step) {
      const at::Tensor x = global_inputs(step);
      const at::Tensor label = global_targets(step).remainder(2);
      adam_d.zero_grad();
      torch::nn::functional::cross_entropy(critic->forward(generator->forward(x).detach()), label).backward();
      adam_d.step();
      adam_g.zero_grad();
      torch::nn::functional::cross_entropy(critic->forward(generator->forward(x)), 1 - label).backward();
      adam_g.step();
    }
    return at::cat({laws::flat_of(generator), laws::flat_of(critic)});
  }();
  const double fp32_difference = (zero - single).abs().max().item<double>();
  LAW_EXPECT(torch::allclose(zero, single, 1e-4, 2e-5), "fp32 stage 2: two models differ from single device by %.3g",
             fp32_difference);

  std::string refusal = "(accepted)";
  try {
    zero_fabric accumulating({}, loom::deepspeed(loom::deepspeed_options{
                                     .config = R"({"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2})"}));
    auto generator = make_net();
    auto critic = make_critic();
    torch::optim::Adam adam_g(generator->parameters()), adam_d(critic->parameters());
    auto first = accumulating.setup(generator, adam_g);
    auto second = accumulating.setup(critic, adam_d);
  } catch (const loom::configuration_error& error) {
    refusal = error.what();
  }
  LAW_EXPECT(refusal.find("a second model on one Fabric") != std::string::npos &&
                 refusal.find("gradient_accumulation_steps = 2") != std::string::npos,
             "a second model under gradient_accumulation_steps 2: %s", refusal.c_str());
  if (laws::rank_for_messages == 0) {
    std::printf("law (two models): a GAN's generator and critic on one Fabric, %d steps each: bf16 with "
                "gradient_clipping 0.05 equals one Fabric per model (max diff %.3g, required 0); fp32 stage 2 "
                "equals single device (max diff %.3g); a second model under accumulation is refused\n",
                steps, bf16_difference, fp32_difference);
    std::fflush(stdout);
  }
}

// NVMe optimizer offload (stage 3, offload_optimizer.device "nvme"): the
// Adam/AdamW state streamed through a file under nvme_path, sub-group by
// sub-group, equals the in-memory step bit for bit, with 1, 2 and 4 buffers;
// each step writes the whole state and (after the first) reads it back; host
// memory holds the buffers only (the optimizer object keeps no state); the
// file is gone at teardown.
void law_nvme() {
  constexpr int steps = 10;
  const std::string directory = test_dir() + "/nvme";
  std::filesystem::create_directories(directory);
  for (bool decoupled : {false, true}) {
    auto train = [&](loom::deepspeed_options options, bool check_stream) {
      const bool params_offloaded = options.offload_params_device == "nvme";
      zero_fabric fabric({}, loom::deepspeed(options));
      auto net = make_net();
      std::unique_ptr<torch::optim::Optimizer> adam;
      if (decoupled) adam = std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
      else adam = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
      auto [model, optimizer] = fabric.setup(net, *adam);
      std::int64_t partition = 0;
      for (const auto& [p, g] : model.session().state()->partitions()) partition += p.numel();
      train_steps(fabric, model, optimizer, 0, steps);
      std::string file;
      if (check_stream) {
        const auto* stream = fabric.strategy().nvme();
        LAW_EXPECT(stream != nullptr, "no NVMe stream");
        if (stream != nullptr) {
          const auto& c = stream->counters();
          file = stream->file();
          LAW_EXPECT(c.sub_groups >= 8, "%llu sub-groups (>= 8 wanted)", static_cast<unsigned long long>(c.sub_groups));
          LAW_EXPECT(c.bytes_written >= static_cast<std::uint64_t>(steps * 8 * partition),
                     "%llu bytes written over %d steps of %ld elements' state",
                     static_cast<unsigned long long>(c.bytes_written), steps, static_cast<long>(partition));
          LAW_EXPECT(c.bytes_read >= static_cast<std::uint64_t>((steps - 1) * 8 * partition),
                     "%llu bytes read", static_cast<unsigned long long>(c.bytes_read));
          LAW_EXPECT(adam->state().empty(), "the optimizer object holds state beside the stream");
          LAW_EXPECT(std::filesystem::exists(file), "the state file %s is missing", file.c_str());
          if (params_offloaded) {
            // Per step, each unit's gathers read its partition (sub-units twice: forward and backward).
            const auto units = model.session().state()->partitions().size();
            LAW_EXPECT(c.shard_loads >= static_cast<std::uint64_t>(steps) * units,
                       "%llu partition reads over %d steps of %zu units", static_cast<unsigned long long>(c.shard_loads),
                       steps, units);
            LAW_EXPECT(model.session().state()->parameter_shard_bytes() == 0,
                       "%lld bytes of parameter partitions resident between steps under offload_param nvme",
                       static_cast<long long>(model.session().state()->parameter_shard_bytes()));
          }
        }
      }
      auto result = laws::flat(laws::full_parameters(model, net));
      return std::make_pair(result, file);
    };
    const auto [reference, none] = train(loom::deepspeed_options{.stage = 3}, false);
    for (bool params : {false, true}) {
      for (int buffers : {1, 2, 4}) {
        loom::deepspeed_options options = nvme_options(params);
        options.optimizer_buffer_count = buffers;
        const auto [result, file] = train(options, true);
        LAW_EXPECT(torch::equal(result, reference), "%s on NVMe%s with %d buffers differs from in memory by %.3g",
                   decoupled ? "AdamW" : "Adam", params ? " (and the parameters)" : "", buffers,
                   (result - reference).abs().max().item<double>());
        LAW_EXPECT(!file.empty() && !std::filesystem::exists(file), "the state file %s is left at teardown",
                   file.c_str());
      }
    }
  }
  if (laws::rank_for_messages == 0) {
    std::printf("law (nvme): stage 3 with the Adam and AdamW state on NVMe (O_DIRECT, io_uring, sub-groups of 64 "
                "elements, 1, 2 and 4 buffers), and with the parameter partitions there too (offload_param: none "
                "resident between steps, each gather reading its partition), equals the in-memory step bit for bit "
                "over %d steps; each step writes the whole state and reads it back; the optimizer object holds none; "
                "files removed\n", steps);
    std::fflush(stdout);
  }
}

// NVMe offload under bf16-mixed (DeepSpeed's bf16 mode): the fp32 masters
// live in the file with the Adam state; the step (clipped by the config's
// gradient_clipping) equals the in-memory masters' step bit for bit, with
// the bf16 partitions in memory and with them on NVMe too.
void law_nvme_bf16() {
  constexpr int steps = 10;
  const std::string directory = test_dir() + "/nvme";
  using bf16_fabric = loom::Fabric<loom::cpu, loom::deepspeed, loom::bf16_mixed>;
  auto train = [&](const std::string& offload) {
    const std::string config = R"({"gradient_clipping": 0.05, "zero_optimization": {"stage": 3, "sub_group_size": 64)" +
                               offload + "}}";
    bf16_fabric fabric({}, loom::deepspeed(loom::deepspeed_options{.config = config}));
    auto net = make_net();
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    auto [model, optimizer] = fabric.setup(net, adamw);
    train_steps(fabric, model, optimizer, 0, steps);
    if (!offload.empty()) {
      LAW_EXPECT(fabric.strategy().master_bytes() == 0, "fp32 masters kept in memory beside the NVMe file");
      LAW_EXPECT(adamw.state().empty(), "the optimizer object holds state beside the stream");
    }
    return laws::flat(laws::full_parameters(model, net));
  };
  const at::Tensor reference = train("");
  const std::string optimizer = R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + directory +
                                R"(", "buffer_count": 2})";
  const std::string parameters = R"(, "offload_param": {"device": "nvme", "nvme_path": ")" + directory + R"("})";
  const at::Tensor on_file = train(optimizer);
  const at::Tensor both = train(optimizer + parameters);
  LAW_EXPECT(reference.scalar_type() == at::kBFloat16, "the module is not bf16");
  LAW_EXPECT(torch::equal(on_file, reference), "bf16 with the masters on NVMe differs from in memory by %.3g",
             (on_file - reference).abs().max().item<double>());
  LAW_EXPECT(torch::equal(both, reference), "bf16 with the masters and parameters on NVMe differs by %.3g",
             (both - reference).abs().max().item<double>());
  if (laws::rank_for_messages == 0) {
    std::printf("law (nvme, bf16): stage 3 under bf16-mixed with the fp32 masters and AdamW state on NVMe (and the "
                "bf16 partitions too), gradient_clipping 0.05: equal to the in-memory masters bit for bit over %d "
                "steps; no master in memory\n", steps);
    std::fflush(stdout);
  }
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }


// Save/load is the identity, per stage: 5 steps, a save (over an older one),
// 5 more (A); a fresh model and optimizer load the save and take the same 5
// (B): A == B bit for bit. The files carry DeepSpeed's names. Rank 0 loads
// the save into single_device (the full parameters at the save) and writes
// it as one full file, for consolidate's comparison in zero.sh.
// Variants (tag): bf16 (the fp32 masters travel in the optim-states files,
// so B does not restart from bf16-rounded masters) and nvme (the state file
// read back into the save, and the loaded state written to it; the save
// also loads into stage 3 in memory, which must train on identically).
template <class F = zero_fabric>
void law_checkpoint(loom::deepspeed_options options, const std::string& tag = "") {
  const int s = options.stage;
  const auto adam_options = torch::optim::AdamOptions(1e-2);
  at::Tensor at_save, a;
  std::string path;
  int world = 0;
  {
    F fabric({}, loom::deepspeed(options));
    world = fabric.world_size();
    path = test_dir() + "/zero" + std::to_string(s) + tag + "_" + std::to_string(world);
    auto net = make_net();
    torch::optim::Adam adam(net->parameters(), adam_options);
    auto [model, optimizer] = fabric.setup(net, adam);
    train_steps(fabric, model, optimizer, 0, 3);
    int step = 3;
    fabric.save(path, {{"model", model}, {"optimizer", optimizer}, {"step", step}});
    train_steps(fabric, model, optimizer, 3, 5);
    step = 5;
    fabric.save(path, {{"model", model}, {"optimizer", optimizer}, {"step", step}});  // replaces the first
    at_save = laws::flat(laws::full_parameters(model, net));
    train_steps(fabric, model, optimizer, 5, 10);
    a = laws::flat(laws::full_parameters(model, net));
    if (options.offload_optimizer_device == "nvme") {
      LAW_EXPECT(adam.state().empty(), "the NVMe-offloaded optimizer keeps the state read back for the save");
    }
  }
  const bool bf16 = tag.rfind("_bf16", 0) == 0;
  if (laws::rank_for_messages == 0) {
    std::ifstream latest(path + "/latest");
    std::string text;
    std::getline(latest, text);
    LAW_EXPECT(text == "checkpoint", "%s/latest holds '%s', not Lightning's tag 'checkpoint'", path.c_str(), text.c_str());
    const std::string dir = path + "/checkpoint/";
    for (int r = 0; r < world; ++r) {
      const std::string optim =
          dir + (bf16 ? "bf16_" : "") + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt";
      const std::string model = dir + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_model_states.pt";
      LAW_EXPECT(exists(optim), "no %s", optim.c_str());
      LAW_EXPECT(exists(model) == (s == 3), "%s %s", model.c_str(), s == 3 ? "missing" : "written below stage 3");
    }
    LAW_EXPECT(exists(dir + "mp_rank_00_model_states.pt") == (s != 3), "mp_rank_00_model_states.pt %s",
               s == 3 ? "written at stage 3" : "missing");
  }
  auto train_on = [&](loom::deepspeed_options loading) {
    F fabric({}, loom::deepspeed(loading));
    auto net = make_net();
    torch::optim::Adam adam(net->parameters(), adam_options);
    auto [model, optimizer] = fabric.setup(net, adam);
    auto rest = fabric.load(path, {{"model", model}, {"optimizer", optimizer}});
    const int loaded_step = rest.template get<int>("step");
    LAW_EXPECT(loaded_step == 5, "the step read back is %d, not 5", loaded_step);
    LAW_EXPECT(!rest.contains("zero_fp32_masters"), "the engine's own entries are returned to the user");
    train_steps(fabric, model, optimizer, 5, 10);
    return laws::flat(laws::full_parameters(model, net));
  };
  const at::Tensor b = train_on(options);
  LAW_EXPECT(torch::equal(a, b), "stage %d%s: training on from the loaded save differs by %.3g", s, tag.c_str(),
             (a - b).abs().max().item<double>());
  if (options.offload_optimizer_device == "nvme") {
    const at::Tensor c = train_on(loom::deepspeed_options{.stage = s});
    LAW_EXPECT(torch::equal(a, c), "stage %d: the NVMe save loaded into stage %d in memory trains on %.3g apart", s, s,
               (a - c).abs().max().item<double>());
  }
  if (laws::rank_for_messages == 0 && tag.empty()) {
    auto single = laws::outside_launcher<loom::Fabric<loom::cpu, loom::single_device>>();
    auto net = make_net();
    torch::optim::Adam adam(net->parameters(), adam_options);
    auto [model, optimizer] = single.setup(net, adam);
    int step = 0;
    single.load(path, {{"model", model}, {"optimizer", optimizer}, {"step", step}});
    LAW_EXPECT(torch::equal(laws::flat_of(net), at_save), "stage %d: single_device reads other parameters", s);
    single.save(path + ".full", {{"model", model}, {"optimizer", optimizer}, {"step", step}});
  }
  if (laws::rank_for_messages == 0) {
    std::printf("law (checkpoint): stage %d%s on %d ranks: DeepSpeed's file names; save, load, 5 more steps equal "
                "training on (max diff %.3g)%s\n",
                s, tag.c_str(), world, (a - b).abs().max().item<double>(),
                tag.empty() ? "; single_device reads the full parameters"
                : bf16      ? "; the fp32 masters come back from the optim-states files"
                            : "; the state file is read into the save and the loaded state written to it; the save "
                              "loads into stage 3 in memory and trains on bit for bit");
    std::fflush(stdout);
  }
}

// exclude_frozen_parameters: the module states leave out what does not
// require grad; such a save loads with strict=false (the frozen parameters
// keep their values) and strict=true names the missing key.
void law_exclude_frozen() {
  const std::string path = test_dir() + "/zero_frozen_" + std::to_string(laws::outside_launcher<zero_fabric>().world_size());
  at::Tensor saved_fc2;
  for (int s : {1, 3}) {
    {
      zero_fabric fabric({}, loom::deepspeed(loom::deepspeed_options{.stage = s, .exclude_frozen_parameters = true}));
      auto net = make_net();
      net->fc1->weight.set_requires_grad(false);
      net->fc1->bias.set_requires_grad(false);
      torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
      auto [model, optimizer] = fabric.setup(net, adam);
      train_steps(fabric, model, optimizer, 0, 2);
      fabric.save(path, {{"model", model}, {"optimizer", optimizer}});
    }
    if (laws::rank_for_messages == 0) {
      const auto contents = loom::read_deepspeed_checkpoint(path);
      const auto module = contents.entries.at("model").toGenericDict();
      LAW_EXPECT(!module.contains("fc1.weight") && !module.contains("fc1.bias") && module.contains("fc2.weight"),
                 "stage %d with exclude_frozen_parameters: the frozen fc1 is saved (or fc2 is not)", s);
      auto single = laws::outside_launcher<loom::Fabric<loom::cpu, loom::single_device>>();
      auto net = make_net();
      const at::Tensor fc1_before = net->fc1->weight.clone();
      torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
      auto [model, optimizer] = single.setup(net, adam);
      bool refused = false;
      try {
        single.load(path, {{"model", model}, {"optimizer", optimizer}});
      } catch (const loom::checkpoint_error& error) {
        refused = std::string(error.what()).find("fc1.weight") != std::string::npos;
      }
      LAW_EXPECT(refused, "a strict load of a save without frozen parameters does not name fc1.weight");
      single.load(path, {{"model", model}, {"optimizer", optimizer}}, /*strict=*/false);
      LAW_EXPECT(torch::equal(net->fc1->weight, fc1_before), "the frozen fc1 changed on a strict=false load");
    }
  }
  if (laws::rank_for_messages == 0) {
    std::printf("law (exclude_frozen_parameters): stages 1 and 3 leave the frozen parameters out of the module "
                "states; strict loads name them, strict=false loads keep them\n");
    std::fflush(stdout);
  }
}

// A checkpoint saved on 2 ranks loads on this world size into every stage
// (stage 3's slices into stage 1, ...): the full parameters equal what
// single_device reads from it, and a step runs.
void law_reshard() {
  for (int saved : {1, 2, 3}) {
    const std::string path = test_dir() + "/zero" + std::to_string(saved) + "_2";
    auto single = laws::outside_launcher<loom::Fabric<loom::cpu, loom::single_device>>();
    auto reference = make_net();
    torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(1e-2));
    auto [ref_model, ref_optimizer] = single.setup(reference, reference_adam);
    single.load(path, {{"model", ref_model}, {"optimizer", ref_optimizer}});
    for (int s : {1, 2, 3}) {
      zero_fabric fabric({}, stage(s));
      auto net = make_net();
      torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
      auto [model, optimizer] = fabric.setup(net, adam);
      fabric.load(path, {{"model", model}, {"optimizer", optimizer}});
      LAW_EXPECT(torch::equal(laws::flat(laws::full_parameters(model, net)), laws::flat_of(reference)),
                 "stage %d's 2-rank save loads into stage %d on %d ranks with other parameters", saved, s,
                 fabric.world_size());
      train_steps(fabric, model, optimizer, 10, 11);
    }
  }
  if (laws::rank_for_messages == 0) {
    std::printf("law (reshard): saves of stages 1, 2, 3 on 2 ranks load into stages 1, 2, 3 on %d ranks, equal to "
                "what single_device reads\n", laws::outside_launcher<zero_fabric>().world_size());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 3 && std::string(argv[1]) == "load_damaged") return laws::load_damaged(argv[2], argv[3]);
  if (argc > 2 && std::string(argv[1]) == "load_check") return laws::load_check(argv[2]);
  using bf16_fabric = loom::Fabric<loom::cpu, loom::deepspeed, loom::bf16_mixed>;
  return laws::worker_main<zero_fabric>(
      argc, argv, "zero laws",
      [](const std::string&, int devices) { return zero_fabric({.devices = loom::devices_spec(devices)}); },
      {{"laws",
        [](zero_fabric&) {
          law_stages();
          for (int s : {1, 2, 3}) law_accumulation_from_json(s, /*through_environment=*/s == 3);
          law_accumulation_from_json(2, false, /*set_to_none=*/true);
          law_accumulation_from_json(3, false, /*set_to_none=*/false);
          law_against_ddp();
          law_bf16();
          law_two_models();
          law_config_clipping_nonfinite();
          law_nvme();
          law_nvme_bf16();
          for (int s : {1, 2, 3}) law_checkpoint(loom::deepspeed_options{.stage = s});
          for (int s : {1, 3}) law_checkpoint<bf16_fabric>(loom::deepspeed_options{.stage = s}, "_bf16");
          law_checkpoint(nvme_options(/*parameters=*/false), "_nvme");
          law_checkpoint(nvme_options(/*parameters=*/true), "_nvme_params");
          law_checkpoint<bf16_fabric>(nvme_options(true), "_bf16_nvme");
          law_exclude_frozen();
        }},
       {"zero_grad",
        [](zero_fabric&) {
          law_accumulation_from_json(2, false, /*set_to_none=*/true);
          law_accumulation_from_json(3, false, /*set_to_none=*/false);
        }},
       {"two_models",
        [](zero_fabric&) {
          law_two_models();
          law_config_clipping_nonfinite();
        }},
       {"reshard", [](zero_fabric&) { law_reshard(); }},
       {"save_forever",
        [](zero_fabric&) {
          zero_fabric fabric({}, stage(3));  // DeepSpeed-layout saves
          laws::save_forever(fabric);
        }}},
      {"save_forever"});
}
