// One program for loom's multi-process tests: run by loom-run, torchrun,
// mpirun or by itself (fabric.launch()), it checks collectives against values
// computed by hand, or plays the part a fault test needs. Exit status 0 means
// every check on this rank passed.
//
//   dist_worker collectives | launch_self N | fork N | allreduce_loop | hang | rendezvous | listen_check
#include <loom/loom.hpp>

#include <torch/nn/modules/linear.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

namespace {

int failures = 0;

#define EXPECT(condition, what)                                                                            \
  do {                                                                                                     \
    if (!(condition)) {                                                                                    \
      ++failures;                                                                                          \
      std::fprintf(stderr, "rank %d: check failed: %s (%s:%d)\n", rank_for_messages, what, __FILE__, __LINE__); \
    }                                                                                                      \
  } while (0)

int rank_for_messages = -1;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::chrono::milliseconds timeout_from_env() {
  const char* text = std::getenv("LOOM_TEST_TIMEOUT_MS");
  return std::chrono::milliseconds(text ? std::atol(text) : 60000);
}

// The collectives, each checked against what it must give on W ranks where
// rank r contributes values derived from r.
template <class Fabric>
void check_collectives(Fabric& fabric) {
  const int r = fabric.global_rank();
  const int w = fabric.world_size();
  rank_for_messages = r;
  const double sum_ranks = w * (w - 1) / 2.0;  // 0 + 1 + ... + (w-1)

  // all_reduce for each op and several dtypes.
  for (auto dtype : {at::kFloat, at::kDouble, at::kInt, at::kLong, at::kBFloat16}) {
    const auto mine = at::full({3}, r + 1, dtype);
    const auto sum = fabric.all_reduce(mine, loom::reduce_op::sum);
    EXPECT(sum.scalar_type() == dtype, "all_reduce keeps the dtype");
    EXPECT(torch::equal(sum, at::full({3}, sum_ranks + w, dtype)), "all_reduce sum");
    EXPECT(torch::equal(mine, at::full({3}, r + 1, dtype)), "all_reduce leaves its input alone");
    EXPECT(torch::equal(fabric.all_reduce(mine, loom::reduce_op::min), at::full({3}, 1, dtype)), "all_reduce min");
    EXPECT(torch::equal(fabric.all_reduce(mine, loom::reduce_op::max), at::full({3}, w, dtype)), "all_reduce max");
    double product = 1;
    for (int k = 1; k <= w; ++k) product *= k;
    EXPECT(torch::equal(fabric.all_reduce(mine, loom::reduce_op::product), at::full({3}, product, dtype)),
           "all_reduce product");
    if (at::isFloatingType(dtype)) {
      EXPECT(torch::allclose(fabric.all_reduce(mine, loom::reduce_op::mean).to(at::kDouble),
                             at::full({3}, (sum_ranks + w) / w, at::kDouble)),
             "all_reduce mean");
    } else {
      bool refused = false;
      try {
        fabric.all_reduce(mine, loom::reduce_op::mean);
      } catch (const loom::configuration_error& error) {
        refused = std::string(error.what()).find("floating-point") != std::string::npos;
      }
      EXPECT(refused, "all_reduce mean of an integer tensor is refused");
    }
  }
  // In place, and on a non-contiguous view.
  auto in_place = at::full({2, 4}, r, at::kFloat);
  auto column = in_place.select(1, 1);
  fabric.all_reduce_(column);
  EXPECT(torch::equal(in_place.select(1, 1), at::full({2}, sum_ranks)), "all_reduce_ on a strided view");
  EXPECT(torch::equal(in_place.select(1, 0), at::full({2}, r)), "all_reduce_ touches only the view");

  // Nested containers: a map of vectors, and a tuple.
  std::map<std::string, std::vector<at::Tensor>> nested{{"a", {at::full({1}, r), at::full({2}, 2.0 * r)}},
                                                        {"b", {at::full({1}, 1.0)}}};
  auto reduced = fabric.all_reduce(nested);
  EXPECT(torch::equal(reduced.at("a")[0], at::full({1}, sum_ranks)), "nested all_reduce (map of vectors)");
  EXPECT(torch::equal(reduced.at("a")[1], at::full({2}, 2 * sum_ranks)), "nested all_reduce second tensor");
  EXPECT(torch::equal(reduced.at("b")[0], at::full({1}, static_cast<double>(w))), "nested all_reduce other key");
  auto tuple = fabric.all_reduce(std::make_tuple(at::full({1}, r), 7, at::full({1}, 1.0)), loom::reduce_op::max);
  EXPECT(torch::equal(std::get<0>(tuple), at::full({1}, w - 1.0)) && std::get<1>(tuple) == 7,
         "nested all_reduce (tuple, non-tensors kept)");

  // all_gather: equal shapes, stacked; unequal shapes, one tensor per rank.
  auto stacked = fabric.all_gather_stacked(at::full({2}, r));
  EXPECT((stacked.sizes() == at::IntArrayRef{w, 2}), "all_gather_stacked shape");
  for (int k = 0; k < w; ++k) EXPECT(torch::equal(stacked[k], at::full({2}, k)), "all_gather_stacked values");
  auto uneven = fabric.all_gather(at::arange(r + 1, at::kLong).reshape({r + 1, 1}));
  EXPECT(static_cast<int>(uneven.size()) == w, "all_gather returns one tensor per rank");
  for (int k = 0; k < w && k < static_cast<int>(uneven.size()); ++k) {
    EXPECT(torch::equal(uneven[static_cast<std::size_t>(k)], at::arange(k + 1, at::kLong).reshape({k + 1, 1})),
           "all_gather of unequal shapes");
  }
  auto gathered_nested = fabric.all_gather_stacked(std::vector<at::Tensor>{at::full({1}, r), at::full({1}, -r)});
  EXPECT(torch::equal(gathered_nested[1].flatten(), -at::arange(w, at::kFloat)), "nested all_gather_stacked");
  bool refused_stack = false;
  try {
    fabric.all_gather_stacked(at::zeros({r + 1}));
  } catch (const loom::configuration_error& error) {
    refused_stack = std::string(error.what()).find("equal shapes") != std::string::npos;
  }
  EXPECT(w == 1 || refused_stack, "all_gather_stacked refuses unequal shapes, naming the rank");

  // all_gather with sync_grads: the gradient of sum_k (k + 1) * gathered[k]
  // summed over all ranks' losses, reaches each rank's input as W * (r + 1).
  auto input = at::full({2}, static_cast<double>(r)).requires_grad_(true);
  auto gathered = fabric.all_gather_stacked(input, /*sync_grads=*/true);
  auto weights = (at::arange(w, at::kDouble) + 1).reshape({w, 1});
  (gathered * weights).sum().backward();
  EXPECT(input.grad().defined() && torch::equal(input.grad(), at::full({2}, static_cast<double>(w * (r + 1)))),
         "all_gather(sync_grads) gradient");

  // broadcast, broadcast_object.
  auto from_last = fabric.broadcast(at::full({3}, 10.0 * r), w - 1);
  EXPECT(torch::equal(from_last, at::full({3}, 10.0 * (w - 1))), "broadcast from the last rank");
  c10::impl::GenericDict object(c10::StringType::get(), c10::AnyType::get());
  object.insert("rank", static_cast<int64_t>(r));
  object.insert("name", std::string("from rank ") + std::to_string(r));
  object.insert("tensor", at::full({2}, r));
  auto received = fabric.broadcast_object(c10::IValue(object), 0).toGenericDict();
  EXPECT(received.at("rank").toInt() == 0 && received.at("name").toStringRef() == "from rank 0" &&
             torch::equal(received.at("tensor").toTensor(), at::zeros({2})),
         "broadcast_object of a dict");
  EXPECT(fabric.broadcast_object(std::string("hello ") + std::to_string(r), 0) == "hello 0",
         "broadcast_object of a string");

  // reduce_scatter: rows r*2 .. r*2+1 of the sum.
  auto rows = at::arange(2 * w, at::kFloat).reshape({2 * w, 1}) * (r + 1);
  auto mine_rows = fabric.reduce_scatter(rows);
  const double factor = sum_ranks + w;
  EXPECT(torch::equal(mine_rows, at::arange(2 * r, 2 * r + 2, at::kFloat).reshape({2, 1}) * factor),
         "reduce_scatter");

  // reduce_boolean_decision.
  EXPECT(fabric.reduce_boolean_decision(true), "reduce_boolean_decision all true");
  EXPECT(fabric.reduce_boolean_decision(r == 0, /*all=*/false), "reduce_boolean_decision any");
  EXPECT(w == 1 || !fabric.reduce_boolean_decision(r == 0, /*all=*/true), "reduce_boolean_decision all, one false");

  // Sub-groups: the even ranks and the odd ranks, then a group of rank 0 alone.
  if (w >= 2) {
    std::vector<int> evens, odds;
    for (int k = 0; k < w; ++k) (k % 2 == 0 ? evens : odds).push_back(k);
    auto even_group = fabric.strategy().new_group(evens);
    auto odd_group = fabric.strategy().new_group(odds);
    auto& my_group = r % 2 == 0 ? even_group : odd_group;
    EXPECT(my_group.valid() && !(r % 2 == 0 ? odd_group : even_group).valid(), "sub-group membership");
    at::Tensor value = at::full({1}, r);
    my_group.all_reduce(value);
    double expected = 0;
    for (int k = r % 2; k < w; k += 2) expected += k;
    EXPECT(torch::equal(value, at::full({1}, expected)), "all_reduce in a sub-group");
    EXPECT(my_group.size() == static_cast<int>((r % 2 == 0 ? evens : odds).size()), "sub-group size");
  }
  fabric.barrier();

  // The sampler shards a dataset by rank.
  auto loader = fabric.setup_dataloaders(
      loom::data::tensor_dataset(at::arange(10, at::kFloat).reshape({10, 1}), at::arange(10)), {.batch_size = 10});
  std::vector<int64_t> seen;
  for (auto& batch : loader) {
    for (int64_t i = 0; i < batch.target.size(0); ++i) seen.push_back(batch.target[i].template item<int64_t>());
  }
  std::vector<int64_t> expected_indices;
  const int per_rank = (10 + w - 1) / w;
  for (int i = 0; i < per_rank; ++i) expected_indices.push_back((r + i * w) % 10);
  EXPECT(seen == expected_indices, "the data loader gives this rank indices r, r + W, ...");
}

template <class Fabric>
int report(Fabric& fabric, const char* what) {
  const bool everyone = fabric.reduce_boolean_decision(failures == 0, /*all=*/true);
  if (fabric.is_global_zero()) {
    std::printf("%s: world_size=%d %s\n", what, fabric.world_size(), everyone ? "all checks passed" : "FAILED");
  }
  return failures == 0 ? 0 : 1;
}

int run_collectives() {
  loom::Fabric<loom::cpu, loom::parallel> fabric({}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  std::printf("rank %d/%d local %d node %d (%s environment)\n", fabric.global_rank(), fabric.world_size(),
              fabric.local_rank(), fabric.node_rank(), fabric.strategy().runtime().cluster().name.c_str());
  check_collectives(fabric);
  return report(fabric, "collectives");
}

int run_launch_self(int devices) {
  loom::Fabric<loom::cpu, loom::parallel> fabric({.devices = devices},
                                                 loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  check_collectives(fabric);
  return report(fabric, "launch_self");
}

int run_fork(int devices) {
  loom::Fabric<loom::cpu, loom::parallel_fork> fabric({.devices = devices},
                                                      loom::parallel_fork(loom::parallel_options{.timeout = timeout_from_env()}));
  return fabric.launch([](auto& f) {
    check_collectives(f);
    return report(f, "fork");
  });
}

// All-reduces until something fails; with LOOM_TEST_KILL_RANK=k, rank k
// kills itself (SIGKILL) in the middle of the loop. Survivors print how long
// the failure took to surface and what it said, and exit with status 3.
int run_allreduce_loop() {
  loom::Fabric<loom::cpu, loom::parallel> fabric({}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  const int kill_rank = std::getenv("LOOM_TEST_KILL_RANK") ? std::atoi(std::getenv("LOOM_TEST_KILL_RANK")) : -1;
  at::Tensor tensor = at::ones({1 << 16});
  auto killed_at = std::chrono::steady_clock::now();
  for (int iteration = 0;; ++iteration) {
    if (iteration == 200 && fabric.global_rank() == kill_rank) {
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
    if (iteration == 200) killed_at = std::chrono::steady_clock::now();
    try {
      fabric.all_reduce_(tensor);
    } catch (const loom::peer_error& error) {
      std::printf("rank %d caught after %.3f s: %s\n", fabric.global_rank(), seconds_since(killed_at), error.what());
      std::fflush(stdout);
      // The group is unusable now: every later collective fails at once.
      try {
        fabric.barrier();
      } catch (const loom::peer_error& again) {
        std::printf("rank %d: next call failed at once: %s\n", fabric.global_rank(),
                    std::string(again.what()).substr(0, 60).c_str());
      }
      return 3;
    }
    tensor.fill_(1.0);
    if (iteration > 200000) return 0;
  }
}

// fabric.launch() started the ranks itself; the last one kills itself. The
// others keep sleeping in their failure handler, so what ends the job is
// rank 0's watch over the ranks it started (it exits with the dead rank's
// status, after ending the others).
int run_launch_kill(int devices) {
  loom::Fabric<loom::cpu, loom::parallel> fabric({.devices = devices},
                                                 loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  at::Tensor tensor = at::ones({8});
  for (int iteration = 0; iteration < 100000; ++iteration) {
    if (iteration == 50 && fabric.global_rank() == devices - 1) ::raise(SIGKILL);
    try {
      fabric.all_reduce_(tensor);
    } catch (const loom::peer_error&) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 3;
    }
    tensor.fill_(1.0);
  }
  return 0;
}

// A rank that stops taking part: rank 1 sleeps; the others time out.
int run_hang() {
  loom::Fabric<loom::cpu, loom::parallel> fabric({}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  if (fabric.global_rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    at::Tensor t = at::ones({4});
    fabric.all_reduce_(t);
  } catch (const loom::peer_error& error) {
    std::printf("rank %d timed out after %.3f s: %s\n", fabric.global_rank(), seconds_since(start), error.what());
    return 3;
  }
  return 0;
}

// Only the rendezvous (for the TCPStore error tests).
int run_rendezvous() {
  const auto start = std::chrono::steady_clock::now();
  try {
    loom::Fabric<loom::cpu, loom::parallel> fabric(
        {}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
    fabric.launch();
    fabric.barrier();
    std::printf("rank %d: rendezvous done\n", fabric.global_rank());
    return 0;
  } catch (const std::exception& error) {
    std::printf("rendezvous failed after %.3f s: %s\n", seconds_since(start), error.what());
    return 3;
  }
}

// Stays in the job for a while so a test can look at its sockets.
int run_listen_check() {
  loom::Fabric<loom::cpu, loom::parallel> fabric({}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  at::Tensor t = at::ones({4});
  fabric.all_reduce_(t);
  std::printf("rank %d pid %d ready\n", fabric.global_rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  fabric.barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "collectives";
  const int devices = argc > 2 ? std::atoi(argv[2]) : 2;
  try {
    if (scenario == "collectives") return run_collectives();
    if (scenario == "launch_self") return run_launch_self(devices);
    if (scenario == "fork") return run_fork(devices);
    if (scenario == "launch_kill") return run_launch_kill(devices);
    if (scenario == "allreduce_loop") return run_allreduce_loop();
    if (scenario == "hang") return run_hang();
    if (scenario == "rendezvous") return run_rendezvous();
    if (scenario == "listen_check") return run_listen_check();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dist_worker %s: %s\n", scenario.c_str(), error.what());
    return 1;
  }
  std::fprintf(stderr, "dist_worker: unknown scenario '%s'\n", scenario.c_str());
  return 2;
}
