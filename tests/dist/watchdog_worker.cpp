// The collective watchdog's scenarios (tests/dist/watchdog.sh and
// tests/stress/watchdog_stuck.sh), under loom-run, torchrun or mpirun:
//   count   DDP's Reducer all-reduces go through the recorder, one entry each;
//   train   DDP training for LOOM_TEST_SECONDS (default: until killed), with
//           collective_timeout LOOM_TEST_COLLECTIVE_S seconds; rank
//           LOOM_TEST_SLOW_RANK sleeps LOOM_TEST_SLOW_MS before every step;
//   stopped_inside  rank 1 stops itself (SIGSTOP) 1 s into an all_reduce
//           that rank 0 joins 2 s late: every rank has entered it and the
//           records agree; only rank 1's heartbeat says it is stopped;
//   desync  rank 0 broadcasts where the others all-reduce (LOOM_TEST_DESYNC=shape:
//           all ranks all-reduce, rank 0 a tensor of another size).
// LOOM_TEST_BACKEND=mpi runs them on loom's MPI group.
#include "law_models.hpp"

#include <loom/environment.hpp>

#include <unistd.h>

#include <csignal>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

// The test's settings, through loom's one parser.
double seconds_from_env(const char* name, double fallback) {
  return loom::cluster::setting_seconds(name, 1e7).value_or(fallback);
}
long long integer_from_env(const char* name, long long minimum, long long fallback) {
  return loom::cluster::setting_integer(name, minimum, 1LL << 40).value_or(fallback);
}

loom::comm::backend backend_from_env() {
  return loom::cluster::setting_text("LOOM_TEST_BACKEND") == "mpi" ? loom::comm::backend::mpi : loom::comm::backend::gloo;
}

loom::ddp_options ddp_from_env(bool pairwise) {
  return loom::ddp_options{
      .pairwise_exchange = pairwise,
      .process = {.backend = backend_from_env(),
                  .collective_timeout = std::chrono::milliseconds(
                      static_cast<std::int64_t>(seconds_from_env("LOOM_TEST_COLLECTIVE_S", 300) * 1000))}};
}

// Every all-reduce of the Reducer (and the pairwise exchange that replaces
// it on two Gloo ranks) is one recorded entry: the recorder's count equals
// the engine's own, and the last entries name float all-reduces.
int run_count() {
  for (const bool pairwise : {false, true}) {
    loom::Fabric<loom::cpu, loom::ddp, loom::fp32> fabric({}, loom::ddp(ddp_from_env(pairwise)));
    fabric.launch();
    laws::rank_for_messages = fabric.global_rank();
    auto net = laws::make_plain();
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
    auto [model, optimizer] = fabric.setup(net, adam);
    const std::uint64_t before = fabric.strategy().gradient_collectives_recorded();
    laws::train_steps(fabric, model, optimizer, 0, 5);
    const std::uint64_t issued = fabric.strategy().gradient_collectives();
    const std::uint64_t recorded = fabric.strategy().gradient_collectives_recorded();
    const std::uint64_t buckets = fabric.strategy().gradient_buckets();
    LAW_EXPECT(recorded == issued, "pairwise=%d: the recorder saw %llu collectives, the engine issued %llu", pairwise,
               static_cast<unsigned long long>(recorded), static_cast<unsigned long long>(issued));
    LAW_EXPECT(recorded - before >= 5 * buckets, "pairwise=%d: 5 steps of %llu buckets recorded only %llu", pairwise,
               static_cast<unsigned long long>(buckets), static_cast<unsigned long long>(recorded - before));
    // The world group records the user's collectives too.
    const std::uint64_t world_before = fabric.strategy().group().collectives_recorded();
    at::Tensor value = at::ones({3, 5});
    fabric.all_reduce_(value);
    const auto last = fabric.strategy().group().recent_collectives(1);
    LAW_EXPECT(fabric.strategy().group().collectives_recorded() == world_before + 1 && last.size() == 1 &&
                   last[0] == "all_reduce(Float[3, 5])",
               "the world group's last entry is '%s'", last.empty() ? "" : last[0].c_str());
    if (fabric.is_global_zero()) {
      std::printf("watchdog count: pairwise_exchange=%d, %llu buckets: %llu gradient collectives recorded, %llu "
                  "issued\n",
                  pairwise, static_cast<unsigned long long>(buckets), static_cast<unsigned long long>(recorded),
                  static_cast<unsigned long long>(issued));
    }
    const bool everyone = fabric.reduce_boolean_decision(laws::failures == 0, /*all=*/true);
    if (fabric.is_global_zero()) {
      std::printf("watchdog count: world_size=%d %s\n", fabric.world_size(), everyone ? "all checks passed" : "FAILED");
    }
  }
  return laws::failures == 0 ? 0 : 1;
}

int run_train() {
  loom::Fabric<loom::cpu, loom::ddp, loom::fp32> fabric({}, loom::ddp(ddp_from_env(true)));
  fabric.launch();
  auto net = laws::make_plain();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto [model, optimizer] = fabric.setup(net, adam);
  const int slow_rank = static_cast<int>(integer_from_env("LOOM_TEST_SLOW_RANK", -1, -1));
  const auto slow = std::chrono::milliseconds(integer_from_env("LOOM_TEST_SLOW_MS", 0, 0));
  const double seconds = seconds_from_env("LOOM_TEST_SECONDS", 0);
  std::printf("rank %d pid %d training\n", fabric.global_rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  int step = 0;
  for (;; ++step) {
    if (fabric.global_rank() == slow_rank) std::this_thread::sleep_for(slow);
    laws::train_steps(fabric, model, optimizer, step % 100, step % 100 + 1);
    // Every rank agrees on when to stop (rank 0's clock decides).
    if (seconds > 0 && step % 4 == 3) {
      const bool done = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= seconds;
      if (fabric.broadcast(done ? 1 : 0, 0) == 1) break;
    }
  }
  std::printf("rank %d: %d steps in %.1f s, done\n", fabric.global_rank(), step + 1,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

int run_desync() {
  loom::Fabric<loom::cpu, loom::parallel> fabric(
      {}, loom::parallel(loom::parallel_options{
              .timeout = std::chrono::milliseconds(integer_from_env("LOOM_TEST_GROUP_TIMEOUT_MS", 1, 1800000)),
              .backend = backend_from_env(),
              .collective_timeout = std::chrono::milliseconds(
                  static_cast<std::int64_t>(seconds_from_env("LOOM_TEST_COLLECTIVE_S", 300) * 1000))}));
  fabric.launch();
  at::Tensor value = at::ones({4});
  fabric.all_reduce_(value);
  std::printf("rank %d pid %d entering the mismatched collective\n", fabric.global_rank(),
              static_cast<int>(::getpid()));
  std::fflush(stdout);
  if (loom::cluster::setting_text("LOOM_TEST_DESYNC") == "shape") {
    // Same op, different sizes: Gloo may fail rather than hang.
    at::Tensor larger = at::ones({fabric.global_rank() == 0 ? 4 : 4096});
    try {
      fabric.all_reduce_(larger);
    } catch (const loom::peer_error& error) {
      std::printf("rank %d: all_reduce failed: %s\n", fabric.global_rank(), error.what());
      return 3;
    }
  } else {
    // A hang; with a group timeout below collective_timeout, Gloo's timeout
    // fails the collective first and the error path names the desync.
    try {
      if (fabric.global_rank() == 0) {
        (void)fabric.broadcast(value, 0);
      } else {
        fabric.all_reduce_(value);
      }
    } catch (const loom::peer_error& error) {
      std::printf("rank %d: the collective failed: %s\n", fabric.global_rank(), error.what());
      return 3;
    }
  }
  fabric.barrier();
  std::printf("rank %d: the mismatched collectives returned\n", fabric.global_rank());
  return 0;
}

int run_stopped_inside() {
  loom::Fabric<loom::cpu, loom::ddp, loom::fp32> fabric({}, loom::ddp(ddp_from_env(false)));
  fabric.launch();
  fabric.barrier();
  std::printf("rank %d pid %d ready\n", fabric.global_rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  if (fabric.global_rank() == 1) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::raise(SIGSTOP);  // the whole process, in the middle of the all_reduce below
    }).detach();
  }
  if (fabric.global_rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  at::Tensor value = at::ones({4});
  fabric.all_reduce_(value);
  std::printf("rank %d: the all_reduce returned\n", fabric.global_rank());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "count";
  try {
    if (scenario == "count") return run_count();
    if (scenario == "train") return run_train();
    if (scenario == "stopped_inside") return run_stopped_inside();
    if (scenario == "desync") return run_desync();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "watchdog_worker %s: %s\n", scenario.c_str(), error.what());
    return 1;
  }
  std::fprintf(stderr, "watchdog_worker: unknown scenario '%s'\n", scenario.c_str());
  return 2;
}
