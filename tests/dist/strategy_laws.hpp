// The laws every data-parallel strategy obeys against single_device, written
// once over the Fabric type and instantiated per strategy by the workers
// (fsdp_worker.cpp). Each rank gets different rows of the same global batch.
#pragma once

#include <loom/environment.hpp>
#include <loom/loom.hpp>

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <type_traits>
#include <string>
#include <vector>

namespace laws {

inline int failures = 0;
inline int rank_for_messages = -1;
#define LAW_EXPECT(condition, ...)                                                                     \
  do {                                                                                                 \
    if (!(condition)) {                                                                                \
      ++laws::failures;                                                                                \
      std::fprintf(stderr, "rank %d: check failed (%s:%d): ", laws::rank_for_messages, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                                               \
      std::fprintf(stderr, "\n");                                                                      \
    }                                                                                                  \
  } while (0)

constexpr int64_t global_batch = 32;

// A law "N ranks equal one" checked on one rank compares one process with
// itself and cannot fail: every multi-rank law first asserts that it runs
// on more than one rank (a launcher that started one process, or a
// world-size variable lost on the way, fails here instead of passing).
template <class F>
void require_multi_rank(F& fabric, const char* what) {
  LAW_EXPECT(fabric.world_size() > 1, "%s ran on world size %d: a multi-rank law needs more than one rank", what,
             fabric.world_size());
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
// make() builds the model (same seed: same initial weights everywhere).
template <class F, class Make>
equivalence_result law_equivalence(F& fabric, Make&& make, const char* what, int steps = 20,
                                   bool build_optimizer_after_setup = false, tolerance allowed = {}) {
  require_multi_rank(fabric, what);
  const int r = fabric.global_rank();
  const int w = fabric.world_size();
  auto net = make();
  auto reference = make();
  auto options = torch::optim::AdamOptions(1e-2);
  torch::optim::Adam reference_adam(reference->parameters(), options);
  equivalence_result result;
  auto run = [&](auto& model, auto& optimizer) {
    const int64_t local = global_batch / w;
    for (int step = 0; step < steps; ++step) {
      const auto x = global_inputs(step);
      const auto y = global_targets(step);
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(x.narrow(0, r * local, local)),
                                                       y.narrow(0, r * local, local));
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

      const auto mine = flat(full_parameters(model, net));
      const auto everyone = fabric.all_gather(mine);
      for (int k = 1; k < w; ++k) {
        LAW_EXPECT(torch::equal(everyone[0], everyone[k]), "%s step %d: rank %d's gathered parameters differ", what,
                   step, k);
      }
    }
    const auto strategy = flat(full_parameters(model, net));
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
  if (r == 0) {
    std::printf("law (equivalence) %s: world_size=%d max |strategy - single| after %d Adam steps = %.3g "
                "(rtol %g, atol %g); max |norm - single norm| = %.3g\n",
                what, w, steps, result.max_difference, allowed.rtol, allowed.atol, result.norm_difference);
    std::fflush(stdout);
  }
  return result;
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
                "gradient raises single_device's error\n", what, worst);
    std::fflush(stdout);
  }
}
template <class F, class Make>
void law_gradient_norm(F& fabric, Make&& make, const char* what) {
  law_gradient_norm(fabric, make, make, what, data_parallel_split(fabric));
}

}  // namespace laws
