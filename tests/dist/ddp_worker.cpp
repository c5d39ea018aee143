// DDP's laws on real processes, each rank fed different data. Started by
// fabric.launch() (`ddp_worker laws 2`) or by loom-run; exit status 0 when
// every check passed on this rank.
#include "law_models.hpp"
#include "strategy_laws.hpp"

#include <loom/environment.hpp>
#include <loom/loom.hpp>

#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

struct NetImpl : torch::nn::Module {
  // with_branch adds a second head; a forward uses one head or the other, so
  // the unused one gets no gradient (the unused-parameter case).
  explicit NetImpl(bool with_branch = false)
      : fc1(register_module("fc1", torch::nn::Linear(16, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, 32))),
        fc3(register_module("fc3", torch::nn::Linear(32, 4))) {
    if (with_branch) skipped = register_module("skipped", torch::nn::Linear(32, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = torch::relu(fc2->forward(torch::relu(fc1->forward(x))));
    return use_branch ? skipped->forward(h) : fc3->forward(h);
  }
  torch::nn::Linear fc1, fc2, fc3, skipped{nullptr};
  bool use_branch = false;
};
TORCH_MODULE(Net);

using ddp_fabric = loom::Fabric<loom::cpu, loom::ddp, loom::fp32>;

// The shared data (rank r takes rows [r * B/W, (r + 1) * B/W) of each global batch).
using laws::global_batch;
using laws::global_inputs;
using laws::global_targets;

at::Tensor flat_parameters(const Net& net) { return laws::flat_of(net); }

Net make_net(bool with_branch = false) {
  at::manual_seed(42);  // ranks that differ here are made equal by DDP's broadcast
  return Net(with_branch);
}

// (a) and (b): the shared equivalence law (bit-identical ranks after every
// step; 20 steps on B/W rows per rank equal one process on B), from a
// different initialisation on every rank: setup must broadcast rank 0's
// (which is make_net()'s).
void law_equivalence(ddp_fabric& fabric) {
  const int r = fabric.global_rank();
  auto make = [r] {
    if (r == 0) return make_net();
    at::manual_seed(100 + r);
    return Net();
  };
  laws::law_equivalence(fabric, make, [] { return make_net(); }, "DDP, each rank initialised apart",
                        laws::data_parallel_split(fabric));
}

// (c): the shared accumulation law (strategy_laws.hpp) with small buckets,
// so that the model spreads over several: the synced backward issues one
// all-reduce per bucket.
void law_accumulation(ddp_fabric& /*unused*/) {
  ddp_fabric fabric({}, loom::ddp(loom::ddp_options{.bucket_cap_mb = 4.0 / 1024, .first_bucket_mb = 1.0 / 1024}));
  laws::law_accumulation(fabric, [] { return make_net(); }, "DDP (small buckets)", [&](auto& model, std::uint64_t synced) {
    const std::size_t buckets = model.session().state()->bucket_count();
    LAW_EXPECT(buckets > 1 && synced == buckets, "%llu all-reduces in the synced backward for %zu buckets",
               static_cast<unsigned long long>(synced), buckets);
  });
}

// (d): a forward that leaves parameters unused.
void law_unused(ddp_fabric& fabric) {
  const int r = fabric.global_rank();
  {
    loom::Fabric<loom::cpu, loom::ddp> finding({}, loom::ddp_find_unused_parameters_true());
    auto net = make_net(/*with_branch=*/true);
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, optimizer] = finding.setup(net, sgd);
    for (int step = 0; step < 4; ++step) {
      net->use_branch = step % 2 == 1;  // alternately skip fc3 and `skipped`
      optimizer.zero_grad();
      finding.backward(model(global_inputs(step).narrow(0, r * 4, 4)).sum());
      optimizer.step();
    }
    const auto everyone = finding.all_gather(flat_parameters(net));
    LAW_EXPECT(torch::equal(everyone[0], everyone[everyone.size(0) - 1]), "find_unused_parameters: ranks diverged");
  }
  {
    auto net = make_net(/*with_branch=*/true);
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, optimizer] = fabric.setup(net, sgd);
    std::string message;
    try {
      for (int step = 0; step < 3; ++step) {
        optimizer.zero_grad();
        fabric.backward(model(global_inputs(step).narrow(0, r * 4, 4)).sum());  // `skipped` never used
        optimizer.step();
      }
    } catch (const loom::configuration_error& error) {
      message = error.what();
    } catch (const std::exception& error) {
      message = std::string("another error: ") + error.what();
    }
    LAW_EXPECT(message.find("find_unused_parameters = true") != std::string::npos,
           "without find_unused_parameters the error says to enable it; got: %s", message.c_str());
  }
}

// Under gradient_as_bucket_view every way of zeroing keeps the gradients as
// the buckets' views, zeroed in place: the next backward writes into the
// buckets without allocating (a zero_grad(true) that bypassed the strategy
// left them undefined).
void expect_bucket_views_kept(const torch::nn::Module& net, const std::vector<const void*>& views) {
  std::size_t i = 0;
  for (const auto& p : net.parameters()) {
    const auto& grad = p.grad();
    LAW_EXPECT(grad.defined(), "parameter %zu: zero_grad dropped its bucket view (gradient undefined)", i);
    if (!grad.defined()) return;
    LAW_EXPECT(grad.data_ptr() == views[i], "parameter %zu: its gradient is no longer the bucket's view", i);
    LAW_EXPECT(grad.abs().max().item<double>() == 0.0, "parameter %zu: zero_grad left %.3g in its bucket view", i,
               grad.abs().max().item<double>());
    ++i;
  }
}

// The other options give the same training: gradients as bucket views
// (zeroed in place), a static graph (first step's all-reduce delayed to the
// end of backward), buffers broadcast, and Gloo's ring instead of loom's
// two-rank exchange.
void law_options(ddp_fabric& /*unused*/) {
  // zero: how the loop zeroes (0: zero_grad(), 1: zero_grad(true), 2: zero_grad(false)).
  auto train = [](loom::ddp_options options, int zero = 0) {
    ddp_fabric fabric({}, loom::ddp(options));
    auto net = make_net();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto [model, optimizer] = fabric.setup(net, sgd);
    const int r = fabric.global_rank();
    const int64_t local = global_batch / fabric.world_size();
    // Each gradient's storage after the second step (the buckets are rebuilt
    // in the order of the first backward at the second forward).
    std::vector<const void*> views;
    for (int step = 0; step < 6; ++step) {
      if (zero == 0) optimizer.zero_grad();
      else optimizer.zero_grad(zero == 1);
      if (options.gradient_as_bucket_view && step > 1) expect_bucket_views_kept(*net, views);
      auto loss = torch::nn::functional::cross_entropy(model(global_inputs(step).narrow(0, r * local, local)),
                                                       global_targets(step).narrow(0, r * local, local));
      fabric.backward(loss);
      optimizer.step();
      if (step == 1)
        for (const auto& p : net->parameters()) views.push_back(p.grad().data_ptr());
    }
    const auto everyone = fabric.all_gather(flat_parameters(net));
    LAW_EXPECT(torch::equal(everyone[0], everyone[everyone.size(0) - 1]), "ranks diverged");
    return flat_parameters(net);
  };
  const auto reference = train({});
  const auto views = train({.gradient_as_bucket_view = true});
  const auto static_graph = train({.static_graph = true});
  const auto ring = train({.pairwise_exchange = false});
  // zero_grad(set_to_none) goes through the strategy: the bucket views are
  // zeroed in place (dropped, as LibTorch's zero_grad(true) did, ...).
  const auto views_to_none = train({.gradient_as_bucket_view = true}, 1);
  const auto views_in_place = train({.gradient_as_bucket_view = true}, 2);
  LAW_EXPECT(torch::equal(views_to_none, views) && torch::equal(views_in_place, views),
         "gradient_as_bucket_view: zero_grad(true) and zero_grad(false) differ from zero_grad() by %.3g and %.3g",
         (views_to_none - views).abs().max().item<double>(), (views_in_place - views).abs().max().item<double>());
  LAW_EXPECT(torch::allclose(views, reference, 1e-5, 1e-6), "gradient_as_bucket_view changes training");
  LAW_EXPECT(torch::allclose(static_graph, reference, 1e-5, 1e-6), "static_graph changes training");
  LAW_EXPECT(torch::allclose(ring, reference, 1e-5, 1e-6), "the ring all-reduce and the exchange disagree");
}

// The shared round trip (strategy_laws.hpp), and the other way: a
// checkpoint single_device wrote loads into DDP.
void law_checkpoint(ddp_fabric& fabric) {
  laws::law_checkpoint_round_trip(fabric, [] { return make_net(); }, "DDP");
  laws::law_zero_grad(fabric, [] { return make_net(); }, "DDP");
  // Not law_failed_step: after a backward that threw, the c10d Reducer loom's
  // DDP runs refuses the next step ("some parameters received no gradient"),
  // as PyTorch's DDP does; recovering would take a new Reducer (not built).
  laws::law_module_outlived(fabric, [] { return make_net(); }, "DDP");
  const std::string path = laws::test_dir() + "/single.ckpt";
  auto net = make_net();
  auto model = fabric.setup(net);
  const auto trained = flat_parameters(net);
  if (fabric.global_rank() == 0) {
    auto single = laws::outside_launcher<loom::Fabric<loom::cpu, loom::single_device>>();
    auto fresh = make_net();
    {
      at::NoGradGuard no_grad;
      fresh->fc1->weight.add_(1.0);
    }
    auto fresh_model = single.setup(fresh);
    single.save(path, {{"model", fresh_model}});
  }
  fabric.barrier();
  fabric.load(path, {{"model", model}});
  LAW_EXPECT(torch::allclose(net->fc1->weight, trained.narrow(0, 0, 32 * 16).reshape({32, 16}) + 1.0),
             "a single_device checkpoint loads back into DDP");
}

// Trains until killed (the kill test watches how fast the job ends).
void train_forever(ddp_fabric& fabric) {
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), 0.01);
  auto [model, optimizer] = fabric.setup(net, sgd);
  std::printf("rank %d pid %d training\n", fabric.global_rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  for (int step = 0;; ++step) {
    optimizer.zero_grad();
    fabric.backward(model(global_inputs(step % 10)).pow(2).mean());
    optimizer.step();
    if (step == 100 && fabric.global_rank() == 1 && loom::cluster::setting_text("LOOM_TEST_SELF_KILL")) ::raise(SIGKILL);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using launcher = loom::Fabric<loom::cpu, loom::ddp>;
  return laws::worker_main<launcher>(
      argc, argv, "ddp laws", [](const std::string&, int devices) { return launcher({.devices = loom::devices_spec(devices)}); },
      {{"laws",
        [](launcher& fabric) {
          law_equivalence(fabric);
          laws::law_gradient_norm(fabric, [] { return make_net(); }, "DDP");
          law_accumulation(fabric);
          law_unused(fabric);
          law_options(fabric);
          law_checkpoint(fabric);
        }},
       {"train_forever", [](launcher& fabric) { train_forever(fabric); }}},
      {"train_forever"});
}
