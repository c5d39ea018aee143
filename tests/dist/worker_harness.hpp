// What every multi-process test worker shares: one check macro, and one main
// for the law workers (ddp_worker, fsdp_worker, zero_worker, tp_worker).
// A failed check prints its rank, place and message and is counted; the
// worker goes on, so one run reports every failure. No LibTorch here: the
// main is a template over the launcher Fabric.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <set>
#include <string>

namespace laws {

inline int failures = 0;
inline int rank_for_messages = -1;

// Wall seconds since `start`, for the laws' printed lines (not asserted on).
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace laws

// LAW_EXPECT(condition, printf-style message...)
#define LAW_EXPECT(condition, ...)                                                                     \
  do {                                                                                                 \
    if (!(condition)) {                                                                                \
      ++laws::failures;                                                                                \
      std::fprintf(stderr, "rank %d: check failed (%s:%d): ", laws::rank_for_messages, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                                               \
      std::fprintf(stderr, "\n");                                                                      \
    }                                                                                                  \
  } while (0)

namespace laws {

// A law "N ranks equal one" checked on one rank compares one process with
// itself and cannot fail: every multi-rank law first asserts that it runs
// on more than one rank (a launcher that started one process, or a
// world-size variable lost on the way, fails here instead of passing).
template <class F>
void require_multi_rank(F& fabric, const char* what) {
  LAW_EXPECT(fabric.world_size() > 1, "%s ran on world size %d: a multi-rank law needs more than one rank", what,
             fabric.world_size());
}

// The scenarios of a worker, by name; each runs on every rank with the
// launcher Fabric (after launch()).
template <class Launcher>
using scenarios = std::map<std::string, std::function<void(Launcher&)>>;

// One main: `WORKER SCENARIO [DEVICES] ...`. make_launcher(scenario, devices)
// builds the launcher Fabric, whose launch() starts DEVICES ranks itself or
// joins the ranks loom-run started; the scenario runs on every rank; rank 0
// ends with "<name> (<scenario>): world_size=W all checks passed" (or
// FAILED). Exit status: 0 when every check on this rank passed, 1 when one
// failed or an exception escaped (named with the rank), 2 for an unknown
// scenario. Scenarios outside `single_rank` must run on more than one rank.
template <class Launcher, class MakeLauncher>
int worker_main(int argc, char** argv, const char* name, MakeLauncher&& make_launcher,
                const scenarios<Launcher>& table, const std::set<std::string>& single_rank = {}) {
  const std::string scenario = argc > 1 ? argv[1] : "laws";
  const auto found = table.find(scenario);
  if (found == table.end()) {
    std::fprintf(stderr, "%s: unknown scenario '%s'\n", name, scenario.c_str());
    return 2;
  }
  try {
    Launcher launcher = make_launcher(scenario, argc > 2 ? std::atoi(argv[2]) : 2);
    launcher.launch();
    rank_for_messages = launcher.global_rank();
    if (single_rank.count(scenario) == 0) require_multi_rank(launcher, (std::string(name) + " (" + scenario + ")").c_str());
    found->second(launcher);
    const bool everyone = launcher.reduce_boolean_decision(failures == 0, /*all=*/true);
    if (launcher.is_global_zero()) {
      std::printf("%s (%s): world_size=%d %s\n", name, scenario.c_str(), launcher.world_size(),
                  everyone ? "all checks passed" : "FAILED");
      std::fflush(stdout);
    }
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s (%s) rank %d: %s\n", name, scenario.c_str(), rank_for_messages, error.what());
    return 1;
  }
}

}  // namespace laws
