// Tensor parallel (loom::tp, strategy model_parallel) against single_device,
// with real processes (tests/dist/tp.sh, under loom-run --devices 2):
//   mlp    a column-wise then row-wise pair inside an MLP: forward outputs and
//          gradients equal the single-device model's (the sharded ones equal
//          its gradient's slice), one all-reduce in forward and one in
//          backward, 1/tp of the sharded weights' bytes per rank, the
//          clipping norm; then the shared laws (equivalence, gradient
//          norm, accumulation, checkpoint round trip);
//   block  a transformer block with attention heads split: forward, gradients,
//          2 + 2 collectives, 20 Adam steps;
//   sequence  the block with sequence parallelism: each all-reduce becomes an
//          all-gather and a reduce-scatter, plus the replicated parameters'
//          gradient all-reduces;
//   dropout   masks agree across the group where activations are replicated
//          and differ where they are sharded;
//   mesh   a 2 x 2 mesh, FSDP on the data-parallel dimension, batch B/2 per
//          data-parallel rank, clipped by norm, equals single_device with B
//          (4 ranks);
//   embed  a vocabulary-parallel Embedding and a column-wise one: outputs and
//          gradients;
//   plan   plans that name a plain torch::nn::Linear, a missing submodule or
//          an indivisible size are refused with a sentence;
//   checkpoint DIR  a 2 x 2 mesh's distributed and full checkpoints;
//   construction  init_module(true) with tensor-parallel layers in units, on
//          a (N/2) x 2 mesh: units sharded as they are built, gathered one
//          at a time at setup, equal to single_device.
// Every rank of the tensor-parallel group sees the same global batch.
#include "../../bench/memory_probe.hpp"
#include "../../bench/tp_block.hpp"
#include "strategy_laws.hpp"

#include <loom/tp/parallelize.hpp>
#include <loom/util/placeholder.hpp>

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace {

using laws::global_batch;

// fc0 is plain, so the pair's input requires grad (its backward all-reduce runs).
template <class Layer>
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc0(register_module("fc0", torch::nn::Linear(16, 32))),
        up(register_module("up", Layer(32, 64))),
        down(register_module("down", Layer(64, 32))),
        head(register_module("head", torch::nn::Linear(32, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return head(torch::relu(down(torch::relu(up(torch::relu(fc0(x))))))); }
  torch::nn::Linear fc0;
  Layer up, down;
  torch::nn::Linear head;
};
using Mlp = torch::nn::ModuleHolder<MlpImpl<loom::tp::Linear>>;
using ReferenceMlp = torch::nn::ModuleHolder<MlpImpl<torch::nn::Linear>>;

template <class M>
M seeded() {
  at::manual_seed(7);
  return M();
}

const loom::tp::parallelize_plan mlp_plan{{"up", loom::tp::colwise_parallel{}}, {"down", loom::tp::rowwise_parallel{}}};

double max_difference(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// The slice of a full tensor this rank's shard holds.
at::Tensor slice_of(const at::Tensor& full, int64_t dim, int rank, int size) { return full.chunk(size, dim)[rank]; }

void run_mlp() {
  loom::Fabric<loom::cpu, loom::model_parallel, loom::fp32> fabric(
      {}, loom::model_parallel(loom::model_parallel_options{
              .parallelize_fn = [](torch::nn::Module& module,
                                   loom::comm::device_mesh& mesh) { loom::tp::parallelize_module(module, mesh, mlp_plan); }}));
  const int r = fabric.global_rank();
  const int tp = fabric.world_size();
  LAW_EXPECT(fabric.strategy().device_mesh().size("tensor_parallel") == tp &&
                 fabric.strategy().device_mesh().size("data_parallel") == 1,
             "the mesh is 1 x %d", tp);

  auto reference = seeded<ReferenceMlp>();
  (void)fabric.strategy().device_mesh();  // the mesh's groups first: what is counted below is the model's
  auto& counter = loom_bench::install_counting_allocator();
  const std::int64_t live_before = counter.live();
  auto net = seeded<Mlp>();
  const std::int64_t full_bytes = counter.live() - live_before;
  // Before the plan, a tp::Linear is a torch::nn::Linear: same initialisation.
  LAW_EXPECT(torch::equal(net->up->weight, reference->up->weight) && torch::equal(net->down->bias, reference->down->bias),
             "tp::Linear starts as torch::nn::Linear with the same seed");
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);

  // What each rank holds: 1/tp of each sharded tensor; the rest replicated.
  std::int64_t sharded_bytes = 0, replicated_bytes = 0;
  for (const auto& item : net->named_parameters()) {
    const bool sharded = item.key().rfind("up.", 0) == 0 || item.key() == "down.weight";
    (sharded ? sharded_bytes : replicated_bytes) += item.value().numel() * item.value().element_size();
  }
  // The counting allocator's view: the full model before, this rank's part after.
  const std::int64_t held_bytes = counter.live() - live_before;
  LAW_EXPECT(held_bytes == sharded_bytes + replicated_bytes && full_bytes == sharded_bytes * tp + replicated_bytes,
             "the allocator holds %lld bytes for the model after the plan (expected %lld), %lld before (expected %lld)",
             static_cast<long long>(held_bytes), static_cast<long long>(sharded_bytes + replicated_bytes),
             static_cast<long long>(full_bytes), static_cast<long long>(sharded_bytes * tp + replicated_bytes));
  LAW_EXPECT(net->up->weight.numel() * tp == reference->up->weight.numel() &&
                 net->up->bias.numel() * tp == reference->up->bias.numel() &&
                 net->down->weight.numel() * tp == reference->down->weight.numel() &&
                 net->down->bias.numel() == reference->down->bias.numel(),
             "column-wise weight and bias and row-wise weight hold 1/%d, the row-wise bias all", tp);
  if (r == 0) {
    std::printf("tp mlp: per rank, sharded parameters %lld bytes (1/%d of %lld), replicated %lld bytes (fc0, "
                "down.bias, head); counting allocator: %lld bytes held after the plan, %lld before\n",
                static_cast<long long>(sharded_bytes), tp, static_cast<long long>(sharded_bytes * tp),
                static_cast<long long>(replicated_bytes), static_cast<long long>(held_bytes),
                static_cast<long long>(full_bytes));
  }

  // One forward and backward against the reference's, on the same batch.
  loom::comm::process_group& group = fabric.strategy().device_mesh().group("tensor_parallel");
  const at::Tensor x = laws::global_inputs(0);
  const at::Tensor y = laws::global_targets(0);
  const std::uint64_t before = group.collectives_recorded();
  at::Tensor out = model(x);
  const std::uint64_t after_forward = group.collectives_recorded();
  at::Tensor loss = torch::nn::functional::cross_entropy(out, y);
  fabric.backward(loss);
  const std::uint64_t after_backward = group.collectives_recorded();
  const at::Tensor expected = reference->forward(x);
  torch::nn::functional::cross_entropy(expected, y).backward();
  const double forward_difference = max_difference(out, expected);
  double gradient_difference = 0;
  gradient_difference = std::max(gradient_difference, max_difference(net->up->weight.grad(),
                                                                     slice_of(reference->up->weight.grad(), 0, r, tp)));
  gradient_difference = std::max(gradient_difference,
                                 max_difference(net->up->bias.grad(), slice_of(reference->up->bias.grad(), 0, r, tp)));
  gradient_difference = std::max(
      gradient_difference, max_difference(net->down->weight.grad(), slice_of(reference->down->weight.grad(), 1, r, tp)));
  for (const char* replicated : {"fc0.weight", "fc0.bias", "down.bias", "head.weight", "head.bias"}) {
    gradient_difference = std::max(gradient_difference, max_difference(net->named_parameters()[replicated].grad(),
                                                                       reference->named_parameters()[replicated].grad()));
  }
  LAW_EXPECT(forward_difference < 1e-5, "forward differs by %.3g", forward_difference);
  LAW_EXPECT(gradient_difference < 1e-5, "gradients differ by %.3g", gradient_difference);
  LAW_EXPECT(after_forward - before == 1 && after_backward - after_forward == 1,
             "a column-then-row pair: %llu collectives in forward, %llu in backward (expected 1 and 1)",
             static_cast<unsigned long long>(after_forward - before),
             static_cast<unsigned long long>(after_backward - after_forward));
  const auto recent = group.recent_collectives(2);
  LAW_EXPECT(recent.size() == 2 && recent[0] == "all_reduce(Float[32, 32])" && recent[1] == "all_reduce(Float[32, 32])",
             "the pair's collectives are the row-wise output's and the column-wise input gradient's all-reduces");

  // The clipping norm counts sharded gradients over the group, replicated once.
  std::vector<at::Tensor> reference_parameters = reference->parameters();
  const double expected_norm = torch::nn::utils::clip_grad_norm_(reference_parameters, 0.5);
  const auto norm = fabric.clip_gradients(model, optimizer, loom::clip_options{.max_norm = 0.5});
  LAW_EXPECT(norm && std::abs(*norm - expected_norm) < 1e-5 * expected_norm, "clip norm %.8g, single device %.8g",
             norm ? *norm : -1.0, expected_norm);
  const double clipped_difference =
      max_difference(net->up->weight.grad(), slice_of(reference->up->weight.grad(), 0, r, tp));
  LAW_EXPECT(clipped_difference < 1e-6, "clipped gradients differ by %.3g", clipped_difference);
  if (r == 0) {
    std::printf("tp mlp: forward max diff %.3g, gradients %.3g, collectives forward %llu backward %llu, clip norm "
                "%.8g (single device %.8g)\n",
                forward_difference, gradient_difference, static_cast<unsigned long long>(after_forward - before),
                static_cast<unsigned long long>(after_backward - after_forward), norm ? *norm : -1.0, expected_norm);
  }

  // Training: the shared laws (strategy_laws.hpp), the group seeing the whole batch.
  laws::law_equivalence(fabric, seeded<Mlp>, seeded<ReferenceMlp>, "tp mlp", laws::batch_split{0, 1});
  laws::law_gradient_norm(fabric, seeded<Mlp>, seeded<ReferenceMlp>, "tp mlp", laws::batch_split{0, 1});
  laws::law_accumulation(fabric, seeded<Mlp>, seeded<ReferenceMlp>, "tp mlp", laws::batch_split{0, 1});
  laws::law_checkpoint_round_trip(fabric, seeded<Mlp>, seeded<ReferenceMlp>, "tp mlp", laws::batch_split{0, 1});
  laws::law_zero_grad(fabric, seeded<Mlp>, "tp mlp", laws::batch_split{0, 1});
}

// A transformer block (bench/tp_block.hpp: pre-norm causal attention, then an
// MLP), 4 heads split over the group: wq, wk, wv and w1 column-wise after a
// Prepare (one gradient all-reduce each for attention and MLP), wo and w2
// row-wise (one all-reduce each): 2 collectives in forward, 2 in backward.
using Block = torch::nn::ModuleHolder<loom_bench::TpBlockImpl<true>>;
using ReferenceBlock = torch::nn::ModuleHolder<loom_bench::TpBlockImpl<false>>;
template <class M>
M seeded_block() {
  at::manual_seed(7);
  return M(32, 4, 128);
}

// sequence: the sequence-parallel plan (the residual stream sharded along
// the sequence, LayerNorms in sequence-parallel regions).
void run_block(bool sequence) {
  loom::Fabric<loom::cpu, loom::model_parallel, loom::fp32> fabric(
      {}, loom::model_parallel(loom::model_parallel_options{
              .parallelize_fn = [sequence](torch::nn::Module& module, loom::comm::device_mesh& mesh) {
                loom_bench::parallelize_block(module, mesh, sequence);
              }}));
  const int r = fabric.global_rank();
  const int tp = fabric.world_size();
  auto reference = seeded_block<ReferenceBlock>();
  auto net = seeded_block<Block>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto [model, optimizer] = fabric.setup(net, adam);
  loom::comm::process_group& group = fabric.strategy().device_mesh().group("tensor_parallel");
  auto batch = [](int step) {
    auto generator = at::detail::createCPUGenerator(300 + step);
    return std::make_pair(at::randn({4, 6, 32}, generator), at::randn({4, 6, 32}, generator));
  };
  // Sequence parallel: this rank's part of the sequence, in and out. The
  // loss is the full mean: each rank's sum over its part, over the full count.
  auto local = [&](const at::Tensor& t) { return sequence ? slice_of(t, 1, r, tp) : t; };
  auto loss_of = [&](const at::Tensor& out, const at::Tensor& target) {
    return sequence ? (out - target).pow(2).sum() / static_cast<double>(target.numel() * tp)
                    : torch::mse_loss(out, target);
  };
  const auto [x, target] = batch(0);
  const std::uint64_t before = group.collectives_recorded();
  at::Tensor out = model(local(x));
  const std::uint64_t after_forward = group.collectives_recorded();
  const auto forward_kinds = group.recent_collectives(after_forward - before);
  fabric.backward(loss_of(out, local(target)));
  const std::uint64_t after_backward = group.collectives_recorded();
  const auto backward_kinds = group.recent_collectives(after_backward - after_forward);
  const at::Tensor expected = local(reference->forward(x));
  torch::mse_loss(reference->forward(x), target).backward();
  const double forward_difference = max_difference(out, expected);
  double gradient_difference = 0;
  for (const char* name : {"wq", "wk", "wv", "w1"}) {
    for (const char* part : {".weight", ".bias"}) {
      const std::string key = std::string(name) + part;
      gradient_difference = std::max(gradient_difference, max_difference(net->named_parameters()[key].grad(),
                                                                         slice_of(reference->named_parameters()[key].grad(), 0, r, tp)));
    }
  }
  for (const char* name : {"wo.weight", "w2.weight"}) {
    gradient_difference = std::max(gradient_difference, max_difference(net->named_parameters()[name].grad(),
                                                                       slice_of(reference->named_parameters()[name].grad(), 1, r, tp)));
  }
  // Replicated: the layer norms and the row-wise biases.
  for (const char* name : {"ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "wo.bias", "w2.bias"}) {
    gradient_difference = std::max(gradient_difference, max_difference(net->named_parameters()[name].grad(),
                                                                       reference->named_parameters()[name].grad()));
  }
  LAW_EXPECT(forward_difference < 1e-5, "block forward differs by %.3g", forward_difference);
  LAW_EXPECT(gradient_difference < 1e-5, "block gradients differ by %.3g", gradient_difference);
  auto count = [](const std::vector<std::string>& kinds, const std::string& prefix) {
    return std::count_if(kinds.begin(), kinds.end(), [&](const std::string& k) { return k.rfind(prefix, 0) == 0; });
  };
  if (!sequence) {
    LAW_EXPECT(after_forward - before == 2 && after_backward - after_forward == 2 &&
                   count(forward_kinds, "all_reduce") == 2 && count(backward_kinds, "all_reduce") == 2,
               "a transformer block: %llu collectives in forward, %llu in backward (expected 2 and 2 all-reduces)",
               static_cast<unsigned long long>(after_forward - before),
               static_cast<unsigned long long>(after_backward - after_forward));
  } else {
    // Each all-reduce becomes an all-gather and a reduce-scatter; backward
    // adds the replicated parameters' all-reduces (2 LayerNorms x 2, 2 biases).
    LAW_EXPECT(count(forward_kinds, "all_gather") == 2 && count(forward_kinds, "reduce_scatter") == 2 &&
                   forward_kinds.size() == 4,
               "sequence parallel forward: %zu collectives", forward_kinds.size());
    LAW_EXPECT(count(backward_kinds, "all_gather") == 2 && count(backward_kinds, "reduce_scatter") == 2 &&
                   count(backward_kinds, "all_reduce") == 6 && backward_kinds.size() == 10,
               "sequence parallel backward: %zu collectives", backward_kinds.size());
  }
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(1e-3));
  optimizer.step();
  reference_adam.step();
  for (int step = 1; step < 20; ++step) {
    const auto [xs, ys] = batch(step);
    optimizer.zero_grad();
    fabric.backward(loss_of(model(local(xs)), local(ys)));
    optimizer.step();
    reference_adam.zero_grad();
    torch::mse_loss(reference->forward(xs), ys).backward();
    reference_adam.step();
  }
  double trained = std::max(max_difference(net->wq->weight, slice_of(reference->wq->weight, 0, r, tp)),
                            max_difference(net->w2->weight, slice_of(reference->w2->weight, 1, r, tp)));
  trained = std::max(trained, max_difference(net->ln1->weight, reference->ln1->weight));
  LAW_EXPECT(trained < 2e-5, "after 20 Adam steps the block's weights differ by %.3g", trained);
  if (r == 0) {
    std::printf("tp %s: %lld of %lld heads per rank; forward max diff %.3g, gradients %.3g, collectives forward "
                "%llu backward %llu\n",
                sequence ? "sequence" : "block", static_cast<long long>(net->local_heads),
                static_cast<long long>(net->heads),
                forward_difference, gradient_difference, static_cast<unsigned long long>(after_forward - before),
                static_cast<unsigned long long>(after_backward - after_forward));
    std::printf("law (tp): transformer block, heads split%s, tensor_parallel=%d: max |tp - single| after 20 Adam "
                "steps = %.3g\n", sequence ? ", sequence parallel" : "", tp, trained);
  }
}

// The MLP's plan on a 2 x 2 mesh (data parallel 2 x tensor parallel 2).
loom::model_parallel mlp_on_2x2_mesh() {
  return loom::model_parallel(loom::model_parallel_options{
      .parallelize_fn = [](torch::nn::Module& module,
                           loom::comm::device_mesh& mesh) { loom::tp::parallelize_module(module, mesh, mlp_plan); },
      .data_parallel_size = 2,
      .tensor_parallel_size = 2});
}

// A 2 x 2 mesh (data parallel 2 x tensor parallel 2, 4 ranks, the FSDP
// engine on the data-parallel dimension): each data-parallel rank trains on
// its half of the global batch; after 20 Adam steps the model's outputs on
// a fresh batch equal single_device's trained on the whole batch.
void run_mesh() {
  loom::Fabric<loom::cpu, loom::model_parallel, loom::fp32> fabric({}, mlp_on_2x2_mesh());
  const int r = fabric.global_rank();
  auto& strategy = fabric.strategy();
  const int dp = strategy.device_mesh().coordinate("data_parallel");
  LAW_EXPECT(strategy.sampler_replicas() == 2 && strategy.sampler_rank() == dp && dp == r / 2,
             "samplers deal over the data-parallel ranks: %d replicas, rank %d", strategy.sampler_replicas(),
             strategy.sampler_rank());
  auto reference = seeded<ReferenceMlp>();
  auto net = seeded<Mlp>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(1e-2));
  const int64_t half = global_batch / 2;
  // Every step clips by norm (0.05, below the gradients' norm, so it
  // scales): sharded gradients summed over both dimensions, replicated ones
  // over data parallel only.
  double norm_error = 0;
  for (int step = 0; step < 20; ++step) {
    const at::Tensor x = laws::global_inputs(step), y = laws::global_targets(step);
    optimizer.zero_grad();
    fabric.backward(torch::nn::functional::cross_entropy(model(x.narrow(0, dp * half, half)),
                                                         y.narrow(0, dp * half, half)));
    const auto norm = fabric.clip_gradients(model, optimizer, loom::clip_options{.max_norm = 0.05});
    optimizer.step();
    reference_adam.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    std::vector<at::Tensor> reference_parameters = reference->parameters();
    const double expected_norm = torch::nn::utils::clip_grad_norm_(reference_parameters, 0.05);
    norm_error = std::max(norm_error, norm ? std::abs(*norm - expected_norm) / expected_norm : 1.0);
    reference_adam.step();
  }
  LAW_EXPECT(norm_error < 1e-5, "2 x 2 mesh: the clipping norm differs from single device's by %.3g (relative)",
             norm_error);
  const at::Tensor probe = laws::global_inputs(99);
  const at::Tensor out = model(probe);
  const double difference = max_difference(out, reference->forward(probe));
  LAW_EXPECT(difference < 2e-5, "2 x 2 mesh: outputs after 20 Adam steps differ by %.3g", difference);
  laws::law_equivalence(fabric, seeded<Mlp>, seeded<ReferenceMlp>, "tp 2 x 2 mesh", laws::batch_split{dp, 2});
  laws::law_gradient_norm(fabric, seeded<Mlp>, seeded<ReferenceMlp>, "tp 2 x 2 mesh", laws::batch_split{dp, 2});
  laws::law_accumulation(fabric, seeded<Mlp>, seeded<ReferenceMlp>, "tp 2 x 2 mesh", laws::batch_split{dp, 2});
  laws::law_checkpoint_round_trip(fabric, seeded<Mlp>, seeded<ReferenceMlp>, "tp 2 x 2 mesh",
                                  laws::batch_split{dp, 2});
  laws::law_zero_grad(fabric, seeded<Mlp>, "tp 2 x 2 mesh", laws::batch_split{dp, 2});
  if (r == 0) {
    std::printf("law (tp): 2 x 2 mesh (data parallel 2 with FSDP x tensor parallel 2), batch %lld per data-parallel "
                "rank, clipped by norm each step: max |outputs - single| after 20 Adam steps = %.3g, clipping norm "
                "relative error %.3g\n",
                static_cast<long long>(half), difference, norm_error);
  }
}

// Tensor-parallel layers inside units, for sharded construction.
struct PairImpl : torch::nn::Module {
  PairImpl() : up(register_module("up", loom::tp::Linear(32, 64))), down(register_module("down", loom::tp::Linear(64, 32))) {}
  at::Tensor forward(const at::Tensor& x) { return down(torch::relu(up(x))); }
  loom::tp::Linear up, down;
};
TORCH_MODULE(Pair);
struct UnitMlpImpl : torch::nn::Module {
  UnitMlpImpl()
      : fc0(register_module("fc0", torch::nn::Linear(16, 32))),
        b0(register_module("b0", loom::unit<Pair>())),
        b1(register_module("b1", loom::unit<Pair>())),
        head(register_module("head", torch::nn::Linear(32, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return head(torch::relu(b1(torch::relu(b0(torch::relu(fc0(x))))))); }
  torch::nn::Linear fc0;
  loom::unit<Pair> b0, b1;
  torch::nn::Linear head;
};
TORCH_MODULE(UnitMlp);

// model_parallel under init_module(true) on a DP x TP mesh: each unit keeps
// its shard of the world from its constructor on (placeholders in the
// module); setup gathers each unit once, keeps this rank's tensor-parallel
// chunks and shards them over the data-parallel group (on one
// data-parallel rank, keeps them). Gathered after setup the parameters
// equal one process's built with the same seed, element for element, and
// training follows the laws.
void run_construction(int dp, int tp) {
  const loom::tp::parallelize_plan plan{{"*.up", loom::tp::colwise_parallel{}},
                                        {"*.down", loom::tp::rowwise_parallel{}}};
  loom::Fabric<loom::cpu, loom::model_parallel, loom::fp32> fabric(
      {}, loom::model_parallel(loom::model_parallel_options{
              .parallelize_fn = [plan](torch::nn::Module& module,
                                       loom::comm::device_mesh& mesh) { loom::tp::parallelize_module(module, mesh, plan); },
              .data_parallel_size = dp,
              .tensor_parallel_size = tp}));
  const std::string what = "model_parallel " + std::to_string(dp) + " x " + std::to_string(tp) + ", init_module(true)";
  auto build = [&] {
    auto guard = fabric.init_module(true);
    return seeded<UnitMlp>();
  };
  auto net = build();
  for (const auto* unit : {&net->b0, &net->b1}) {
    for (const auto& p : (*unit)->parameters()) {
      LAW_EXPECT(loom::detail::is_placeholder(p), "%s: a unit's parameter holds %zu bytes, not a placeholder",
                 what.c_str(), p.storage().nbytes());
    }
  }
  auto reference = seeded<UnitMlp>();
  laws::law_built_as_whole(fabric, net, reference, what.c_str());
  const int rank_dp = fabric.strategy().device_mesh().coordinate("data_parallel");
  laws::law_equivalence(fabric, build, seeded<UnitMlp>, what.c_str(), laws::batch_split{rank_dp, dp});
  if (fabric.is_global_zero()) {
    std::printf("law (tp construction): %s: units keep their shard of the world from construction; setup gathers "
                "each once, keeps the tensor-parallel chunks%s; equal to one process's element for element\n",
                what.c_str(), dp > 1 ? " and shards them over data parallel" : "");
  }
}

// Checkpoints of a 2 x 2 mesh (FSDP on data parallel 2 x tensor parallel 2),
// in `directory`: the distributed save (each rank's chunks, sliced again by
// the engine) and the full save each load into a fresh 2 x 2 model and
// optimizer, whose outputs equal the saved model's and whose next Adam step
// equals its next step (the optimizer state came back); both
// load into single_device with the same outputs. tp.sh then consolidates
// the distributed one and compares it with the full file.
void run_checkpoint(const std::string& directory) {
  loom::Fabric<loom::cpu, loom::model_parallel, loom::fp32> fabric({}, mlp_on_2x2_mesh());
  const int r = fabric.global_rank();
  const int dp = fabric.strategy().device_mesh().coordinate("data_parallel");
  const int64_t half = global_batch / 2;
  auto step_on = [&](auto& model, auto& optimizer, int step) {
    optimizer.zero_grad();
    fabric.backward(torch::nn::functional::cross_entropy(model(laws::global_inputs(step).narrow(0, dp * half, half)),
                                                         laws::global_targets(step).narrow(0, dp * half, half)));
    optimizer.step();
  };
  auto net = seeded<Mlp>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  for (int step = 0; step < 5; ++step) step_on(model, optimizer, step);
  const std::string distributed = directory + "/distributed";
  const std::string full = directory + "/full.pt";
  fabric.save(distributed, {{"model", model}, {"optimizer", optimizer}, {"step", 5}});
  fabric.strategy().set_save_distributed_checkpoint(false);
  fabric.save(full, {{"model", model}, {"optimizer", optimizer}, {"step", 5}});
  fabric.strategy().set_save_distributed_checkpoint(true);
  LAW_EXPECT(loom::is_sharded_checkpoint(distributed), "the default save wrote a distributed (sharded) directory");
  const at::Tensor probe = laws::global_inputs(99);
  const at::Tensor saved_out = model(probe);

  // A fresh model and optimizer on the same mesh (another seed), loaded.
  at::manual_seed(8);
  Mlp other;
  torch::optim::Adam other_adam(other->parameters(), torch::optim::AdamOptions(1e-2));
  auto [loaded, loaded_optimizer] = fabric.setup(other, other_adam);
  auto rest = fabric.load(distributed, {{"model", loaded}, {"optimizer", loaded_optimizer}});
  LAW_EXPECT(rest.get<int>("step") == 5, "the step entry came back as %d", rest.get<int>("step"));
  const at::Tensor loaded_out = loaded(probe);
  LAW_EXPECT(torch::equal(loaded_out, saved_out), "the distributed checkpoint loads back: outputs differ by %.3g",
             max_difference(loaded_out, saved_out));
  // The full file into another fresh 2 x 2 model: each rank reads its
  // chunk and slice of every tensor from it.
  at::manual_seed(10);
  Mlp third;
  torch::optim::Adam third_adam(third->parameters(), torch::optim::AdamOptions(1e-2));
  auto [from_full, from_full_optimizer] = fabric.setup(third, third_adam);
  fabric.load(full, {{"model", from_full}, {"optimizer", from_full_optimizer}});
  LAW_EXPECT(torch::equal(from_full(probe), saved_out), "the full checkpoint loads on 2 x 2: outputs differ by %.3g",
             max_difference(from_full(probe), saved_out));
  step_on(model, optimizer, 5);
  step_on(loaded, loaded_optimizer, 5);
  step_on(from_full, from_full_optimizer, 5);
  const double after_step = max_difference(loaded(probe), model(probe));
  LAW_EXPECT(after_step == 0, "the next Adam step after the load differs by %.3g (optimizer state)", after_step);
  const double after_full_step = max_difference(from_full(probe), model(probe));
  LAW_EXPECT(after_full_step == 0, "the next Adam step after the full load differs by %.3g (optimizer state)",
             after_full_step);

  // The full file and the distributed directory into single_device.
  double single_full = -1, single_distributed = -1;
  if (r == 0) {
    auto single = laws::outside_launcher<loom::Fabric<loom::cpu, loom::single_device>>();
    for (const std::string& path : {full, distributed}) {
      at::manual_seed(9);
      ReferenceMlp fresh;
      torch::optim::Adam fresh_adam(fresh->parameters(), torch::optim::AdamOptions(1e-2));
      auto [fresh_model, fresh_optimizer] = single.setup(fresh, fresh_adam);
      single.load(path, {{"model", fresh_model}, {"optimizer", fresh_optimizer}});
      (path == full ? single_full : single_distributed) = max_difference(fresh_model(probe), saved_out);
    }
    LAW_EXPECT(single_full < 1e-6 && single_distributed < 1e-6,
               "single_device loads them with outputs differing by %.3g (full) and %.3g (distributed)", single_full,
               single_distributed);
  }
  if (r == 0) {
    std::printf("law (tp): 2 x 2 mesh checkpoints: the distributed save (4 rank files + meta.pt) and the full save "
                "each load on a fresh 2 x 2 model (each rank reading its parts) with equal outputs and an equal next "
                "Adam step; single_device loads the full file (outputs "
                "differ by %.3g) and the distributed directory (%.3g)\n",
                single_full, single_distributed);
  }
}

// Dropout masks: identical across the group where the activations are
// replicated (a torch::nn::Dropout, the global generator seeded alike on
// every rank), independent where they are sharded (sequence_parallel: a
// generator per rank, from the global seed).
void run_dropout() {
  struct TwoImpl : torch::nn::Module {
    TwoImpl()
        : replicated(register_module("replicated", loom::tp::Dropout(0.5))),
          sharded(register_module("sharded", loom::tp::Dropout(0.5))) {}
    loom::tp::Dropout replicated, sharded;
  };
  loom::Fabric<loom::cpu, loom::parallel> fabric({}, loom::parallel());
  laws::rank_for_messages = fabric.global_rank();
  auto two = std::make_shared<TwoImpl>();
  at::manual_seed(11);
  loom::tp::parallelize_module(*two, fabric.strategy().group(), {{"sharded", loom::tp::sequence_parallel{}}});
  const at::Tensor ones = at::ones({4, 64, 16});
  const at::Tensor a = two->replicated(ones);
  const at::Tensor b = two->sharded(ones);
  const at::Tensor gathered_a = fabric.all_gather(a);
  const at::Tensor gathered_b = fabric.all_gather(b);
  const bool same_replicated = torch::equal(gathered_a[0], gathered_a[1]);
  const bool differ_sharded = !torch::equal(gathered_b[0], gathered_b[1]);
  const double kept = (b != 0).to(at::kDouble).mean().item<double>();
  LAW_EXPECT(same_replicated, "replicated activations: the masks must agree across the group");
  LAW_EXPECT(differ_sharded, "sequence-sharded activations: the masks must differ across the group");
  LAW_EXPECT(std::abs(kept - 0.5) < 0.05, "the sharded dropout kept %.3f of the values (p = 0.5)", kept);
  if (fabric.is_global_zero()) {
    std::printf("tp dropout: replicated masks equal across ranks %d, sequence-parallel masks differ %d, kept %.3f\n",
                same_replicated, differ_sharded, kept);
  }
}

// Vocabulary-parallel (row-wise) and column-wise Embeddings.
template <class Embedding>
struct EmbedImpl : torch::nn::Module {
  EmbedImpl()
      : vocab(register_module("vocab", Embedding(64, 12))), wide(register_module("wide", Embedding(64, 8))) {}
  at::Tensor forward(const at::Tensor& ids) { return torch::cat({vocab(ids), wide(ids)}, -1); }
  Embedding vocab, wide;
};
using Embed = torch::nn::ModuleHolder<EmbedImpl<loom::tp::Embedding>>;
using ReferenceEmbed = torch::nn::ModuleHolder<EmbedImpl<torch::nn::Embedding>>;

void run_embed() {
  const loom::tp::parallelize_plan plan{{"vocab", loom::tp::rowwise_parallel{.input_layout = loom::tp::replicate()}},
                                        {"wide", loom::tp::colwise_parallel{.output_layout = loom::tp::replicate()}}};
  loom::Fabric<loom::cpu, loom::model_parallel, loom::fp32> fabric(
      {}, loom::model_parallel(loom::model_parallel_options{
              .parallelize_fn = [&plan](torch::nn::Module& module, loom::comm::device_mesh& mesh) {
                loom::tp::parallelize_module(module, mesh, plan);
              }}));
  const int r = fabric.global_rank();
  const int tp = fabric.world_size();
  auto reference = seeded<ReferenceEmbed>();
  (void)fabric.strategy().device_mesh();  // the mesh's groups first: what is counted below is the model's
  auto& counter = loom_bench::install_counting_allocator();
  const std::int64_t live_before = counter.live();
  auto net = seeded<Embed>();
  const std::int64_t full_bytes = counter.live() - live_before;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));  // no momentum: no state
  auto [model, optimizer] = fabric.setup(net, sgd);
  const std::int64_t held_bytes = counter.live() - live_before;
  LAW_EXPECT(net->vocab->weight.size(0) * tp == 64 && net->wide->weight.size(1) * tp == 8,
             "the vocabulary-parallel weight holds 1/%d of the rows, the column-wise one 1/%d of the columns", tp, tp);
  // The counting allocator's view: both weights whole before the plan, 1/tp of them after.
  const std::int64_t expected_full = (64 * 12 + 64 * 8) * static_cast<std::int64_t>(sizeof(float));
  LAW_EXPECT(full_bytes == expected_full && held_bytes * tp == full_bytes,
             "the allocator holds %lld bytes for the embeddings after the plan, %lld before (expected %lld and %lld)",
             static_cast<long long>(held_bytes), static_cast<long long>(full_bytes),
             static_cast<long long>(expected_full / tp), static_cast<long long>(expected_full));
  if (r == 0) {
    std::printf("tp embed: per rank, vocabulary-parallel and column-wise weights %lld bytes (1/%d of %lld); counting "
                "allocator: %lld bytes held after the plan, %lld before\n",
                static_cast<long long>(held_bytes), tp, static_cast<long long>(full_bytes),
                static_cast<long long>(held_bytes), static_cast<long long>(full_bytes));
  }
  auto generator = at::detail::createCPUGenerator(5);
  const at::Tensor ids = at::randint(0, 64, {4, 10}, generator);
  const at::Tensor weights = at::randn({4, 10, 20}, generator);
  at::Tensor out = model(ids);
  fabric.backward((out * weights).sum());
  const at::Tensor expected = reference->forward(ids);
  (expected * weights).sum().backward();
  const double forward_difference = max_difference(out, expected);
  const double gradient_difference =
      std::max(max_difference(net->vocab->weight.grad(), slice_of(reference->vocab->weight.grad(), 0, r, tp)),
               max_difference(net->wide->weight.grad(), slice_of(reference->wide->weight.grad(), 1, r, tp)));
  LAW_EXPECT(forward_difference < 1e-6 && gradient_difference < 1e-6, "embeddings: forward %.3g, gradients %.3g",
             forward_difference, gradient_difference);
  if (r == 0) {
    std::printf("tp embed: forward max diff %.3g, gradients %.3g\n", forward_difference, gradient_difference);
  }
}

bool refused_with(const std::function<void()>& body, const std::string& expected) {
  try {
    body();
  } catch (const loom::configuration_error& error) {
    if (std::string(error.what()).find(expected) != std::string::npos) return true;
    std::fprintf(stderr, "rank %d: refused with: %s\n", laws::rank_for_messages, error.what());
    return false;
  }
  return false;
}

void run_plan() {
  loom::Fabric<loom::cpu, loom::parallel> fabric({}, loom::parallel());
  laws::rank_for_messages = fabric.global_rank();
  loom::comm::process_group& group = fabric.strategy().group();
  LAW_EXPECT(refused_with(
                 [&] {
                   auto plain = seeded<ReferenceMlp>();
                   loom::tp::parallelize_module(*plain, group, mlp_plan);
                 },
                 "but it is torch::nn::LinearImpl, which cannot run a style's collectives (LibTorch has no forward "
                 "hooks). Declare it as loom::tp::Linear"),
             "a plan naming a plain Linear is refused, naming the holder to use");
  LAW_EXPECT(refused_with(
                 [&] {
                   auto net = seeded<Mlp>();
                   loom::tp::parallelize_module(*net, group, {{"middle", loom::tp::colwise_parallel{}}});
                 },
                 "the plan names 'middle', which matches no submodule; the module has: fc0, up, down, head"),
             "a plan naming no submodule lists the names");
  LAW_EXPECT(refused_with(
                 [&] {
                   auto net = seeded<Mlp>();
                   loom::tp::parallelize_module(*net, group, {{"head", loom::tp::colwise_parallel{}}});
                 },
                 "but it is torch::nn::LinearImpl"),
             "head is plain");
  if (fabric.world_size() > 1) {
    struct OddImpl : torch::nn::Module {
      OddImpl() : layer(register_module("layer", loom::tp::Linear(4, 3))) {}
      loom::tp::Linear layer;
    };
    auto odd = std::make_shared<OddImpl>();
    LAW_EXPECT(refused_with([&] { loom::tp::parallelize_module(*odd, group, {{"layer", loom::tp::colwise_parallel{}}}); },
                            "which splits its out_features (3) over 2 tensor-parallel ranks; it must be a multiple "
                            "of 2"),
               "an out_features the group does not divide is refused");
  }
  LAW_EXPECT(refused_with(
                 [&] {
                   (void)loom::detail::model_parallel_sizes(2, 3, 4, 1);
                 },
                 "data_parallel_size 2 x tensor_parallel_size 3 = 6 ranks, but the world size is 4"),
             "sizes that do not multiply to the world are refused, naming the three numbers");
  if (fabric.is_global_zero()) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Every scenario runs under loom-run, which says how many ranks.
  using launcher = loom::Fabric<loom::cpu, loom::model_parallel, loom::fp32>;
  const std::string directory = argc > 2 ? argv[2] : "";
  return laws::worker_main<launcher>(argc, argv, "tp laws", [](const std::string&, int) { return launcher(); },
                                     {{"mlp", [](launcher&) { run_mlp(); }},
                                      {"embed", [](launcher&) { run_embed(); }},
                                      {"block", [](launcher&) { run_block(false); }},
                                      {"sequence", [](launcher&) { run_block(true); }},
                                      {"dropout", [](launcher&) { run_dropout(); }},
                                      {"mesh", [](launcher&) { run_mesh(); }},
                                      {"construction", [](launcher& fabric) {
                                         run_construction(fabric.world_size() / 2, 2);
                                       }},
                                      {"plan", [](launcher&) { run_plan(); }},
                                      {"checkpoint", [&](launcher&) { run_checkpoint(directory); }}});
}
