// The laws every strategy obeys against single_device, written once over the
// Fabric type and instantiated per strategy by the workers (ddp, fsdp, zero
// and tp_worker.cpp): equivalence (N ranks with B/N rows equal one with B),
// the gradient norm, accumulation under no_backward_sync, the checkpoint
// round trip, zero_grad's two ways, a failed step, and a loss that outlives
// its module. Each data-parallel rank gets different rows of the same global
// batch (batch_split).
#pragma once

#include "worker_harness.hpp"

#include <loom/environment.hpp>
#include <loom/loom.hpp>
#include <loom/strategy/ddp_engine.hpp>   // the laws read the engines' own counters
#include <loom/strategy/fsdp_engine.hpp>

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <memory>
#include <type_traits>
#include <string>
#include <vector>

namespace laws {

constexpr int64_t global_batch = 32;

// Where the workers write (the dist scripts set LOOM_TEST_DIR to the
// test's own directory, removed after it).
inline std::string test_dir() {
  return loom::cluster::setting_text("LOOM_TEST_DIR").value_or("/tmp");
}

// Builds a Fabric that loom-run's flags do not describe (single_device in
// one rank, a second strategy beside the launched one): loom-run's check of
// the Fabric against its flags (LT_CLI_USED) is lifted while it is built.
template <class F, class... Args>
F outside_launcher(Args&&... args) {
  struct lifted {
    std::string kept;
    lifted() {
      kept = loom::cluster::process_environment()("LT_CLI_USED").value_or("");
      ::unsetenv("LT_CLI_USED");
    }
    ~lifted() {
      if (!kept.empty()) ::setenv("LT_CLI_USED", kept.c_str(), 1);
    }
  } guard;
  return F(std::forward<Args>(args)...);
}

inline at::Tensor global_inputs(int step) {
  auto generator = at::detail::createCPUGenerator(1000 + step);
  return at::randn({global_batch, 16}, generator);
}
inline at::Tensor global_targets(int step) {
  auto generator = at::detail::createCPUGenerator(2000 + step);
  return at::randint(0, 4, {global_batch}, generator);
}

// The parameters of a set-up module at full size, in the module's order:
// strategies that shard gather them (a collective: every rank calls it).
template <class Model, class Net>
std::vector<at::Tensor> full_parameters(Model& model, Net& net) {
  std::vector<at::Tensor> out;
  if constexpr (requires { model.session().state()->gather_full_parameters(-1, nullptr); }) {
    std::map<std::string, at::Tensor> by_name;
    model.session().state()->gather_full_parameters(
        -1, [&](const std::string& name, const at::Tensor& full) { by_name[name] = full.detach().clone(); });
    for (const auto& item : net->named_parameters()) out.push_back(by_name.at(item.key()));
  } else {
    for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  }
  return out;
}
// ... under any strategy: model_parallel's tensor-parallel chunks are
// gathered over the tensor-parallel group too (inside the engine's gather
// on the data-parallel dimension, as its full checkpoints are).
template <class F, class Model, class Net>
std::vector<at::Tensor> full_parameters(F& fabric, Model& model, Net& net) {
  if constexpr (requires { fabric.strategy().device_mesh(); }) {
    std::vector<at::Tensor> out;
    std::vector<std::weak_ptr<loom::detail::fsdp_engine>> engines;
    if (model.session().state()) engines.push_back(model.session().state());
    loom::detail::with_full_state(engines, {net.get()}, {}, /*keeps=*/true, [&] {
      for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
    });
    return out;
  } else {
    return full_parameters(model, net);
  }
}
inline at::Tensor flat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.reshape({-1}));
  return at::cat(parts);
}
template <class Net>
at::Tensor flat_of(Net& net) {
  std::vector<at::Tensor> parts;
  for (const auto& p : net->parameters()) parts.push_back(p.detach().reshape({-1}));
  return at::cat(parts);
}

// Sharded construction's law (init_module(true)): net, set up with an Adam
// optimizer, has the parameters reference (built whole, same seed) has,
// element for element, once gathered.
template <class F, class Net, class Reference>
void law_built_as_whole(F& fabric, Net& net, Reference& reference, const char* what) {
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  const at::Tensor gathered = flat(full_parameters(fabric, model, net));
  const at::Tensor expected = flat_of(reference);
  LAW_EXPECT(torch::equal(gathered, expected), "%s: the gathered parameters differ from one process's by %.3g", what,
             (gathered - expected).abs().max().template item<double>());
}

// Which rows of the global batch this rank trains on: the data-parallel
// rank among `size` (every rank of a tensor-parallel group sees the same rows).
struct batch_split {
  int rank = 0;
  int size = 1;
  at::Tensor rows(const at::Tensor& global) const {
    const int64_t local = global.size(0) / size;
    return global.narrow(0, rank * local, local);
  }
};
template <class F>
batch_split data_parallel_split(F& fabric) {
  return {fabric.global_rank(), fabric.world_size()};
}

// How far the strategy may be from one process, and why (stated by the caller).
struct tolerance {
  double rtol = 1e-4;
  double atol = 2e-5;
  double norm_rtol = 1e-5;  // clip_gradients' norm against the single-device one
};

struct equivalence_result {
  double max_difference = 0;
  double norm_difference = 0;
};

// Law 1: `steps` Adam steps of the strategy on N ranks with B/N rows each
// equal `steps` steps of one process with B (within tolerance: only the
// order of float additions differs); every rank holds bit-identical
// parameters after every step; clip_gradients returns the single-device norm.
// make() builds the model (same seed: same initial weights everywhere),
// make_reference() the same model for one process (make() may build a
// parallelized one); split says which rows this rank trains on.
template <class F, class Make, class MakeReference>
equivalence_result law_equivalence(F& fabric, Make&& make, MakeReference&& make_reference, const char* what,
                                   batch_split split, int steps = 20, bool build_optimizer_after_setup = false,
                                   tolerance allowed = {}) {
  require_multi_rank(fabric, what);
  const auto started = std::chrono::steady_clock::now();
  const int w = fabric.world_size();
  auto net = make();
  auto reference = make_reference();
  auto options = torch::optim::AdamOptions(1e-2);
  torch::optim::Adam reference_adam(reference->parameters(), options);
  equivalence_result result;
  const int64_t local = global_batch / split.size;
  auto run = [&](auto& model, auto& optimizer) {
    for (int step = 0; step < steps; ++step) {
      const auto x = global_inputs(step);
      const auto y = global_targets(step);
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(split.rows(x)), split.rows(y));
      fabric.backward(loss);
      const auto norm = fabric.clip_gradients(model, optimizer, loom::clip_options{.max_norm = 1e9});
      optimizer.step();

      reference_adam.zero_grad();
      {
        auto autocast = fabric.autocast();  // the same precision for the reference's forward
        torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
      }
      const double reference_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), 1e9);
      result.norm_difference = std::max(result.norm_difference, std::abs(norm.value_or(-1) - reference_norm));
      LAW_EXPECT(norm && std::abs(*norm - reference_norm) <= allowed.norm_rtol * reference_norm + 1e-7,
                 "%s step %d: clip_gradients returned %.9g, single device %.9g", what, step, norm.value_or(-1),
                 reference_norm);
      reference_adam.step();

      const auto mine = flat(full_parameters(fabric, model, net));
      const auto everyone = fabric.all_gather(mine);
      for (int k = 1; k < w; ++k) {
        LAW_EXPECT(torch::equal(everyone[0], everyone[k]), "%s step %d: rank %d's gathered parameters differ", what,
                   step, k);
      }
    }
    const auto strategy = flat(full_parameters(fabric, model, net));
    const auto single = flat_of(reference);
    result.max_difference = (strategy - single).abs().max().template item<double>();
    // Each rank sums its rows, then the shards are averaged across ranks:
    // the same terms as one process, added in another order. fp32 rounds at
    // 6e-8 relative; Adam divides by sqrt(v), so a rounding difference in a
    // gradient near zero moves its element by up to a few lr * 1e-3 over 20
    // steps. Observed: see the printed figure.
    LAW_EXPECT(torch::allclose(strategy, single, allowed.rtol, allowed.atol),
               "%s on %d ranks with batch %ld each differs from one process with batch %ld by %.3g", what, w, local,
               global_batch, result.max_difference);
  };
  using strategy_type = std::remove_cvref_t<decltype(fabric.strategy())>;
  bool done = false;
  if constexpr (!loom::needs_joint_setup<strategy_type>) {  // ZeRO takes both together
    if (build_optimizer_after_setup) {
      auto model = fabric.setup(net);
      torch::optim::Adam adam(net->parameters(), options);  // sees the shards
      auto optimizer = fabric.setup_optimizers(adam);
      run(model, optimizer);
      done = true;
    }
  }
  if (!done) {
    torch::optim::Adam adam(net->parameters(), options);
    auto [model, optimizer] = fabric.setup(net, adam);
    run(model, optimizer);
  }
  if (fabric.global_rank() == 0) {
    std::printf("law (equivalence) %s: world_size=%d max |strategy - single| after %d Adam steps = %.3g "
                "(rtol %g, atol %g); max |norm - single norm| = %.3g (%.2f s)\n",
                what, w, steps, result.max_difference, allowed.rtol, allowed.atol, result.norm_difference,
                seconds_since(started));
    std::fflush(stdout);
  }
  return result;
}
template <class F, class Make>
equivalence_result law_equivalence(F& fabric, Make&& make, const char* what, int steps = 20,
                                   bool build_optimizer_after_setup = false, tolerance allowed = {}) {
  return law_equivalence(fabric, make, make, what, data_parallel_split(fabric), steps, build_optimizer_after_setup,
                         allowed);
}

// What single_device's clip_gradients throws for these options on gradients
// that hold a NaN: torch::nn::utils::clip_grad_norm_'s c10::Error.
inline std::string single_device_nonfinite_error(const std::vector<at::Tensor>& parameters, double norm_type) {
  try {
    torch::nn::utils::clip_grad_norm_(parameters, 1.0, norm_type, /*error_if_nonfinite=*/true);
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  }
  return "(no error)";
}

// Law: clip_gradients' norm of each order (1, 2, infinity) is single_device's,
// and a non-finite norm fails as single_device's does: torch's c10::Error and
// message on every rank (the NaN is in the last rank's rows only), or, with
// error_if_nonfinite = false, a NaN norm returned. make_reference() builds the
// same model for one process (make() may build a parallelized one).
template <class F, class Make, class MakeReference>
void law_gradient_norm(F& fabric, Make&& make, MakeReference&& make_reference, const char* what,
                       batch_split split, double norm_rtol = 1e-5) {
  require_multi_rank(fabric, what);
  const auto started = std::chrono::steady_clock::now();
  auto net = make();
  auto reference = make_reference();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  auto backward = [&](bool poisoned) {
    at::Tensor x = global_inputs(0);
    if (poisoned) x.narrow(0, global_batch - 1, 1).fill_(std::numeric_limits<float>::quiet_NaN());
    const at::Tensor y = global_targets(0);
    optimizer.zero_grad();
    fabric.backward(torch::nn::functional::cross_entropy(model(split.rows(x)), split.rows(y)));
    for (auto& p : reference->parameters()) p.mutable_grad() = at::Tensor();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
  };
  const double infinity = std::numeric_limits<double>::infinity();
  backward(false);
  double worst = 0;
  for (double order : {1.0, 2.0, infinity}) {
    // A limit no norm reaches: the gradients stay as they are for the next order.
    const auto norm = fabric.clip_gradients(model, optimizer, loom::clip_options{.max_norm = 1e30, .norm_type = order});
    const double expected = torch::nn::utils::clip_grad_norm_(reference->parameters(), 1e30, order);
    worst = std::max(worst, std::abs(norm.value_or(-1) - expected) / expected);
    LAW_EXPECT(norm && std::abs(*norm - expected) <= norm_rtol * expected, "%s: the norm of order %g is %.9g, single "
               "device %.9g", what, order, norm.value_or(-1), expected);
  }
  backward(true);
  for (double order : {2.0, infinity}) {
    const std::string expected = single_device_nonfinite_error(reference->parameters(), order);
    std::string got = "(no error)";
    try {
      (void)fabric.clip_gradients(model, optimizer, loom::clip_options{.max_norm = 1.0, .norm_type = order});
    } catch (const c10::Error& error) {
      got = error.what_without_backtrace();
    } catch (const std::exception& error) {
      got = std::string("not a c10::Error: ") + error.what();
    }
    LAW_EXPECT(got == expected, "%s: a non-finite norm of order %g raised \"%s\"; single device raises \"%s\"", what,
               order, got.c_str(), expected.c_str());
  }
  const auto unchecked = fabric.clip_gradients(model, optimizer,
                                               loom::clip_options{.max_norm = 1.0, .error_if_nonfinite = false});
  LAW_EXPECT(unchecked && std::isnan(*unchecked), "%s: with error_if_nonfinite false the norm is %.9g, not NaN", what,
             unchecked.value_or(0));
  if (fabric.global_rank() == 0) {
    std::printf("law (gradient norm) %s: orders 1, 2, inf within %.3g of single device (relative); a NaN "
                "gradient raises single_device's error (%.2f s)\n", what, worst, seconds_since(started));
    std::fflush(stdout);
  }
}
template <class F, class Make>
void law_gradient_norm(F& fabric, Make&& make, const char* what) {
  law_gradient_norm(fabric, make, make, what, data_parallel_split(fabric));
}

// Sets up make()'s model with Adam (jointly, as every strategy takes it).
// The model's gradient reductions so far (DDP's bucket all-reduces, the
// sharding engine's reduce-scatters and all-reduces; 0 without an engine).
template <class Model>
std::uint64_t gradient_reductions(Model& model) {
  auto& state = model.session().state();
  if constexpr (requires { state->collectives_issued(); }) {
    return state->collectives_issued();
  } else {
    if (!state) return 0;
    const auto& counters = state->counters();
    return counters.reduce_scatters + counters.all_reduces;
  }
}

// Law: gradient accumulation over `accumulation` micro-batches, all but the
// last under no_backward_sync, equals one step on the whole batch
// (single_device, within tolerance); the skipped backward passes issue no
// gradient reduction (from the third step: DDP broadcasts its learnt bucket
// order once, in a forward), the synced one at least one. after(model,
// reductions of the last synced backward) adds a strategy's own checks.
struct no_more_checks {
  template <class Model>
  void operator()(Model& /*model*/, std::uint64_t /*synced*/) const {}
};
template <class F, class Make, class MakeReference, class After = no_more_checks>
void law_accumulation(F& fabric, Make&& make, MakeReference&& make_reference, const char* what, batch_split split,
                      After&& after = {}, tolerance allowed = {}) {
  require_multi_rank(fabric, what);
  const auto started = std::chrono::steady_clock::now();
  constexpr int accumulation = 4;
  constexpr int steps = 4;
  auto net = make();
  auto reference = make_reference();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  const int64_t micro = global_batch / split.size / accumulation;
  std::uint64_t skipped = 0, synced = 0;
  for (int step = 0; step < steps; ++step) {
    const at::Tensor x = global_inputs(50 + step), y = global_targets(50 + step);
    optimizer.zero_grad();
    for (int m = 0; m < accumulation; ++m) {
      const int64_t first = (split.rank * accumulation + m) * micro;
      const std::uint64_t before = gradient_reductions(model);
      auto run = [&] {
        fabric.backward(torch::nn::functional::cross_entropy(model(x.narrow(0, first, micro)), y.narrow(0, first, micro)) /
                        accumulation);
      };
      if (m + 1 < accumulation) {
        auto guard = fabric.no_backward_sync(model);
        run();
        if (step >= 2) skipped += gradient_reductions(model) - before;
      } else {
        run();
        synced = gradient_reductions(model) - before;
      }
    }
    optimizer.step();
    reference_adam.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    reference_adam.step();
  }
  const at::Tensor mine = flat(full_parameters(fabric, model, net));
  const double difference = (mine - flat_of(reference)).abs().max().template item<double>();
  LAW_EXPECT(torch::allclose(mine, flat_of(reference), allowed.rtol, allowed.atol),
             "%s: accumulated over %d micro-batches differs from the whole batch by %.3g", what, accumulation,
             difference);
  LAW_EXPECT(skipped == 0, "%s: %llu gradient reductions under no_backward_sync", what,
             static_cast<unsigned long long>(skipped));
  if constexpr (requires { fabric.strategy().device_mesh(); }) {
    // (without a data-parallel engine nothing is reduced across replicas)
  } else {
    LAW_EXPECT(synced > 0, "%s: the synced backward reduced nothing", what);
  }
  if (fabric.global_rank() == 0) {
    std::printf("law (accumulation) %s: %d micro-batches, %d under no_backward_sync: max |accumulated - whole "
                "batch| = %.3g; 0 reductions skipped, %llu in the synced backward (%.2f s)\n",
                what, accumulation, accumulation - 1, difference, static_cast<unsigned long long>(synced),
                seconds_since(started));
    std::fflush(stdout);
  }
  after(model, synced);
}
template <class F, class Make, class After = no_more_checks>
void law_accumulation(F& fabric, Make&& make, const char* what, After&& after = {}) {
  law_accumulation(fabric, make, make, what, data_parallel_split(fabric), after);
}

// Law: save is the identity. 3 Adam steps, fabric.save (model, optimizer,
// a step count), 3 more; then fabric.load of the save and the same 3 steps
// again give the same parameters bit for bit (the optimizer state came
// back). single_device (another program, in effect) loads the save into a
// model whose weights differ: it gets the saved parameters exactly, and its
// 3 steps on the whole batch from the loaded state equal the strategy's
// (within tolerance).
// Law 5: optimizer.zero_grad(false) zeroes each gradient in place (it stays
// defined, as torch.optim's set_to_none=False leaves it) and zero_grad(true)
// sets it to none, whatever the strategy keeps behind the parameters; the
// training is the same bit for bit (the next reduction adds onto zeros or
// writes onto nothing).
template <class F, class Make>
void law_zero_grad(F& fabric, Make&& make, const char* what, batch_split split) {
  require_multi_rank(fabric, what);
  const auto started = std::chrono::steady_clock::now();
  auto train = [&](bool set_to_none) {
    auto net = make();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto [model, optimizer] = fabric.setup(net, sgd);
    for (int step = 0; step < 3; ++step) {
      optimizer.zero_grad(set_to_none);
      std::size_t i = 0;
      for (const auto& p : net->parameters()) {
        const auto& grad = p.grad();
        if (set_to_none) {
          LAW_EXPECT(!grad.defined(), "%s: after zero_grad(true) parameter %zu still has a gradient", what, i);
        } else if (step > 0) {
          LAW_EXPECT(grad.defined(), "%s: zero_grad(false) set parameter %zu's gradient to none", what, i);
          LAW_EXPECT(!grad.defined() || grad.numel() == 0 || grad.abs().max().template item<double>() == 0.0,
                     "%s: zero_grad(false) left parameter %zu's gradient nonzero", what, i);
        }
        ++i;
      }
      fabric.backward(torch::nn::functional::cross_entropy(model(split.rows(global_inputs(step))),
                                                           split.rows(global_targets(step))));
      optimizer.step();
    }
    return flat(full_parameters(fabric, model, net));
  };
  const at::Tensor to_none = train(true);
  const at::Tensor in_place = train(false);
  LAW_EXPECT(torch::equal(to_none, in_place), "%s: zero_grad(false) trains other than zero_grad(true), by %.3g", what,
             (to_none - in_place).abs().max().template item<double>());
  if (fabric.global_rank() == 0) {
    std::printf("law (zero_grad) %s: zero_grad(false) keeps zeroed gradients, zero_grad(true) none; the same "
                "training bit for bit (%.2f s)\n", what, seconds_since(started));
    std::fflush(stdout);
  }
}
template <class F, class Make>
void law_zero_grad(F& fabric, Make&& make, const char* what) {
  law_zero_grad(fabric, make, what, data_parallel_split(fabric));
}

template <class F, class Make, class MakeReference>
void law_checkpoint_round_trip(F& fabric, Make&& make, MakeReference&& make_reference, const char* what,
                               batch_split split, tolerance allowed = {}) {
  require_multi_rank(fabric, what);
  const auto started = std::chrono::steady_clock::now();
  static int saves = 0;
  const std::string path = test_dir() + "/round_trip_" +
                           std::to_string(saves++) + "_of_" + std::to_string(fabric.world_size());
  auto net = make();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  auto train = [&](auto& m, auto& o, int from, int to) {
    for (int step = from; step < to; ++step) {
      o.zero_grad();
      fabric.backward(torch::nn::functional::cross_entropy(m(split.rows(global_inputs(step))),
                                                           split.rows(global_targets(step))));
      o.step();
    }
  };
  train(model, optimizer, 0, 3);
  fabric.save(path, {{"model", model}, {"optimizer", optimizer}, {"step", 3}});
  const at::Tensor saved = flat(full_parameters(fabric, model, net));
  train(model, optimizer, 3, 6);
  const at::Tensor continued = flat(full_parameters(fabric, model, net));

  double single_difference = 0;
  if (fabric.global_rank() == 0) {
    auto single = outside_launcher<loom::Fabric<loom::cpu, loom::single_device>>();
    auto fresh = make_reference();
    {
      at::NoGradGuard no_grad;
      for (auto& p : fresh->parameters()) p.add_(1.0);
    }
    torch::optim::Adam fresh_adam(fresh->parameters(), torch::optim::AdamOptions(1e-2));
    auto [fresh_model, fresh_optimizer] = single.setup(fresh, fresh_adam);
    auto rest = single.load(path, {{"model", fresh_model}, {"optimizer", fresh_optimizer}});
    LAW_EXPECT(torch::equal(flat_of(fresh), saved), "%s: single_device loads other parameters than were saved", what);
    LAW_EXPECT(rest.contains("step") && rest.template get<int>("step") == 3, "%s: the step entry did not come back",
               what);
    const batch_split whole;
    for (int step = 3; step < 6; ++step) {
      fresh_optimizer.zero_grad();
      single.backward(torch::nn::functional::cross_entropy(fresh_model(whole.rows(global_inputs(step))),
                                                           whole.rows(global_targets(step))));
      fresh_optimizer.step();
    }
    single_difference = (flat_of(fresh) - continued).abs().max().template item<double>();
    LAW_EXPECT(torch::allclose(flat_of(fresh), continued, allowed.rtol, allowed.atol),
               "%s: single_device's 3 steps from the loaded state differ from the strategy's by %.3g", what,
               single_difference);
  }
  fabric.barrier();
  fabric.load(path, {{"model", model}, {"optimizer", optimizer}});
  LAW_EXPECT(torch::equal(flat(full_parameters(fabric, model, net)), saved), "%s: the save does not load back", what);
  train(model, optimizer, 3, 6);
  const at::Tensor again = flat(full_parameters(fabric, model, net));
  LAW_EXPECT(torch::equal(again, continued), "%s: training after the load differs from training on by %.3g", what,
             (again - continued).abs().max().template item<double>());
  if (fabric.global_rank() == 0) {
    std::printf("law (checkpoint round trip) %s: save, load, 3 Adam steps equal training on bit for bit; "
                "single_device loads it and its 3 steps differ by %.3g (%.2f s)\n", what, single_difference,
                seconds_since(started));
    std::fflush(stdout);
  }
}
template <class F, class Make>
void law_checkpoint_round_trip(F& fabric, Make&& make, const char* what) {
  law_checkpoint_round_trip(fabric, make, make, what, data_parallel_split(fabric));
}

// Where the failing models (law_models.hpp) throw, if anywhere.
enum class planted_failure { none, forward, backward };
inline planted_failure& planted() {
  static planted_failure where = planted_failure::none;
  return where;
}
inline void throw_if_planted(planted_failure here) {
  if (planted() == here) {
    throw std::runtime_error(here == planted_failure::forward ? "planted failure in a forward"
                                                              : "planted failure in a backward");
  }
}

// Law: a step that throws inside the model (on every rank alike) leaves
// nothing behind. make() builds a model that throws where planted() says:
// inside a unit's backward (after some of its gradients, and other units'
// reductions, are under way) and, the step after, inside its forward (its
// parameters gathered); the next steps, zero_grad(false) first as any loop
// does, equal single_device's steps that skip the failed ones (within
// tolerance), every rank bit-identical.
template <class F, class Make>
void law_failed_step(F& fabric, Make&& make, const char* what, tolerance allowed = {}) {
  require_multi_rank(fabric, what);
  const auto started = std::chrono::steady_clock::now();
  const batch_split split = data_parallel_split(fabric);
  auto net = make();
  auto reference = make();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, optimizer] = fabric.setup(net, adam);
  auto failing = [&](planted_failure where, int step) {
    planted() = where;
    bool thrown = false;
    try {
      optimizer.zero_grad(false);
      fabric.backward(torch::nn::functional::cross_entropy(model(split.rows(global_inputs(step))),
                                                           split.rows(global_targets(step))));
    } catch (const std::runtime_error& error) {
      thrown = std::string(error.what()).find("planted failure") != std::string::npos;
      LAW_EXPECT(thrown, "%s: the planted failure came out as: %s", what, error.what());
    }
    planted() = planted_failure::none;
    LAW_EXPECT(thrown, "%s: the step with a planted failure did not throw", what);
  };
  for (int step = 0; step < 6; ++step) {
    if (step == 2) {
      failing(planted_failure::backward, 100);
      failing(planted_failure::forward, 101);
    }
    optimizer.zero_grad(false);
    fabric.backward(torch::nn::functional::cross_entropy(model(split.rows(global_inputs(step))),
                                                         split.rows(global_targets(step))));
    optimizer.step();
    reference_adam.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(global_inputs(step)), global_targets(step)).backward();
    reference_adam.step();
  }
  const auto strategy = flat(full_parameters(fabric, model, net));
  const auto everyone = fabric.all_gather(strategy);
  for (int k = 1; k < fabric.world_size(); ++k) {
    LAW_EXPECT(torch::equal(everyone[0], everyone[k]), "%s: after a failed step rank %d's parameters differ", what, k);
  }
  const double difference = (strategy - flat_of(reference)).abs().max().template item<double>();
  LAW_EXPECT(torch::allclose(strategy, flat_of(reference), allowed.rtol, allowed.atol),
             "%s: training on after a step that threw in backward and one that threw in forward differs from "
             "single_device without them by %.3g", what, difference);
  if (fabric.global_rank() == 0) {
    std::printf("law (failed step) %s: a step that threw inside a unit's backward, then one inside its forward, "
                "then 4 Adam steps: max |strategy - single| = %.3g (rtol %g, atol %g) (%.2f s)\n",
                what, difference, allowed.rtol, allowed.atol, seconds_since(started));
    std::fflush(stdout);
  }
}

// Law: a loss kept alive past the set-up module it was computed through.
// A sharded strategy's backward needs the module's engine (it gathers the
// parameters again): backward throws loom::usage_error saying so (the
// engine's autograd hooks hold it weakly), not a use-after-free; run under
// AddressSanitizer by tests/sanitize.sh (asan-dist). The others' backward
// needs only what autograd holds (DDP's reducer is shared with its hooks):
// it runs, as it does in PyTorch.
template <class F, class Make>
void law_module_outlived(F& fabric, Make&& make, const char* what) {
  using strategy_type = std::remove_cvref_t<decltype(fabric.strategy())>;
  constexpr bool needs_module = requires { requires strategy_type::is_sharded; };
  const batch_split split = data_parallel_split(fabric);
  auto net = make();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  at::Tensor loss;
  {
    auto [model, optimizer] = fabric.setup(net, adam);
    loss = torch::nn::functional::cross_entropy(model(split.rows(global_inputs(0))), split.rows(global_targets(0)));
  }
  std::string message = "(none: backward ran)";
  try {
    fabric.backward(loss);
  } catch (const loom::usage_error& error) {
    message = error.what();
  }
  const bool refused = message.find("setup is gone") != std::string::npos;
  LAW_EXPECT(refused == needs_module, "%s: backward through a destroyed module: %s", what, message.c_str());
  if (fabric.global_rank() == 0) {
    std::printf("law (module outlived) %s: backward of a loss whose module was destroyed: %.70s...\n", what,
                message.c_str());
    std::fflush(stdout);
  }
}
}  // namespace laws
