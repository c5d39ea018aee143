// loom's collective microbenchmarks: what the alpha-beta model
// (network_model.hpp) is fitted from (loom-bench --fit-network), and the
// replay of one step's collectives alone, what it is validated against.
// Every rank of the job runs the same schedule, through a process group of
// its own formed like any strategy's (the `parallel` strategy's): each
// timed sequence starts after a barrier and is timed on rank 0.
#pragma once

#include "network_model.hpp"

#include <loom/comm/capabilities.hpp>
#include <loom/comm/traffic.hpp>

#include <memory>
#include <optional>
#include <vector>

namespace loom_bench {

struct fit_options {
  // 4 KiB to 16 MiB, doubling: a model's messages fall between points.
  std::vector<double> payload_bytes = [] {
    std::vector<double> sizes;
    for (double bytes = 4 << 10; bytes <= 16 << 20; bytes *= 2) sizes.push_back(bytes);
    return sizes;
  }();
  int rounds = 9;
  int calls = 5;  // timed back to back per kind, size and round (after one untimed)
  // How all_gather_into and reduce_scatter_into run on Gloo: loom's
  // point-to-point exchange (what strategies use), or the measured fallbacks
  // (Gloo's alltoall, its list all_gather): loom::comm::emulation.
  loom::comm::emulation emulation = loom::comm::emulation::point_to_point;
  // The kinds measured (--fit-kinds): the model needs them all; a
  // comparison of one kind (bench/allreduce.sh) measures only it.
  std::vector<loom::comm::collective_kind> kinds = {
      loom::comm::collective_kind::all_reduce, loom::comm::collective_kind::all_gather,
      loom::comm::collective_kind::reduce_scatter, loom::comm::collective_kind::broadcast,
      loom::comm::collective_kind::barrier};
  // Also c10d's own allreduce on the Gloo group underneath loom's (the
  // same sockets and threads; loom's watchdog recorder left out), on the
  // same buffer, right before or after loom's all_reduce (the order
  // alternating by round): samples of kind raw_all_reduce_kind, what loom
  // adds to a raw c10d call (--fit-raw-baseline). The model ignores them.
  bool raw_all_reduce = false;
};

// The sample kind of fit_options::raw_all_reduce's measurements.
inline constexpr const char* raw_all_reduce_kind = "c10d_allreduce";

class collective_bench {
 public:
  // Forms the group on this backend (a collective: every rank of the job
  // calls it; mpi: under mpirun). Throws loom::configuration_error on one rank.
  explicit collective_bench(loom::comm::backend backend = loom::comm::backend::gloo);
  ~collective_bench();
  collective_bench(const collective_bench&) = delete;
  collective_bench& operator=(const collective_bench&) = delete;

  int ranks() const;
  int rank() const;

  // One round of the microbenchmarks: each of options.kinds (all_reduce,
  // all_gather_into, reduce_scatter_into, broadcast, barrier) at each payload
  // (float32), `calls` timed calls each. Rounds may be interleaved with replays, so
  // that a slow phase of the machine falls on both alike.
  void measure_round(const fit_options& options);
  // Rank 0: each kind and payload's median over the rounds so far (the
  // other ranks: none).
  std::vector<sample> samples() const;
  // measure_round `rounds` times, then samples().
  std::vector<sample> measure(const fit_options& options);

  // Each value summed over the ranks (one all-reduce; every rank calls it
  // with as many values).
  std::vector<double> sum_over_ranks(const std::vector<double>& values);

  // Rank 0's trace of one step, broadcast to every rank so that all replay
  // the same: an index for replay_once, or nullopt when it holds a
  // collective this group cannot replay as it ran (a group of another size;
  // gather, scatter, reduce or all_to_all), the same answer on every rank.
  std::optional<std::size_t> plan_replay(const std::vector<loom::comm::traced_collective>& trace);
  // The plan's collectives on this group one after another, through the
  // calls strategies use (all_reduce, all_gather_into, ...), timed after a
  // barrier: ms on this rank.
  double replay_once(std::size_t plan);

 private:
  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace loom_bench
