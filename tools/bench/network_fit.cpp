#include "network_fit.hpp"

#include "results.hpp"

#include <loom/accelerator/cpu.hpp>
#include <loom/comm/c10d_baseline.hpp>
#include <loom/errors.hpp>
#include <loom/fabric.hpp>
#include <loom/strategy/parallel.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace loom_bench {

using loom::comm::collective_kind;

namespace {

// The float32 elements a collective of `payload_bytes` runs on among `ranks`:
// a multiple of the ranks (every chunk whole), at least one per rank.
std::int64_t floats_for(std::uint64_t payload_bytes, int ranks) {
  return std::max<std::int64_t>(static_cast<std::int64_t>(payload_bytes / 4) / ranks * ranks, ranks);
}

}  // namespace

struct collective_bench::state {
  explicit state(loom::comm::backend backend)
      : fabric({}, loom::parallel(loom::parallel_options{.backend = backend})) {}

  loom::Fabric<loom::cpu, loom::parallel> fabric;
  loom::comm::process_group* group = nullptr;
  // Buffers by float count: {whole (the payload), one rank's chunk}, made once.
  std::map<std::int64_t, std::pair<at::Tensor, at::Tensor>> buffers;
  std::map<std::pair<std::string, std::uint64_t>, std::vector<double>> times;  // measure_round's, per call
  std::vector<std::vector<loom::comm::traced_collective>> plans;                  // plan_replay's
  int rounds = 0;                                                                 // measure_round's so far

  std::pair<at::Tensor, at::Tensor>& buffers_for(std::int64_t elements) {
    auto it = buffers.find(elements);
    if (it == buffers.end()) {
      it = buffers.emplace(elements, std::pair{at::empty({elements}).fill_(1),
                                               at::empty({elements / group->size()}).fill_(1)})
               .first;
    }
    return it->second;
  }

  // One collective of `kind` carrying `payload_bytes` (traffic.hpp's
  // payload: an all-gather's result, a reduce-scatter's input), in float32
  // rounded to a multiple of the ranks; false for a kind it does not run.
  bool run(collective_kind kind, std::uint64_t payload_bytes) {
    const auto elements = floats_for(payload_bytes, group->size());
    switch (kind) {
      case collective_kind::all_reduce:
      case collective_kind::all_reduce_coalesced: group->all_reduce(buffers_for(elements).first); return true;
      case collective_kind::all_gather:
      case collective_kind::all_gather_coalesced: {
        auto& [whole, chunk] = buffers_for(elements);
        group->all_gather_into(whole, chunk).wait();
        return true;
      }
      case collective_kind::reduce_scatter: {
        auto& [whole, chunk] = buffers_for(elements);
        group->reduce_scatter_into(chunk, whole).wait();
        return true;
      }
      case collective_kind::broadcast: group->broadcast(buffers_for(elements).first); return true;
      case collective_kind::barrier: group->barrier(); return true;
      default: return false;
    }
  }

  // c10d's allreduce of the same buffer on the Gloo group under loom's.
  void run_raw_all_reduce(std::uint64_t payload_bytes) {
    loom::comm::c10d_allreduce_baseline(*group, buffers_for(floats_for(payload_bytes, group->size())).first);
  }

  // Seconds from a barrier's end to the call's, on this rank.
  double timed(const std::function<void()>& call) {
    group->barrier();
    const auto start = std::chrono::steady_clock::now();
    call();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

collective_bench::collective_bench(loom::comm::backend backend) : state_(std::make_unique<state>(backend)) {
  state_->fabric.launch();
  state_->group = &state_->fabric.strategy().group();
  if (state_->group->size() < 2) {
    throw loom::configuration_error("loom-bench measures collectives between ranks: start it on 2 or more "
                                    "(loom-bench --fit-network FILE --world-sizes 2)");
  }
}

collective_bench::~collective_bench() = default;

int collective_bench::ranks() const { return state_->group->size(); }
int collective_bench::rank() const { return state_->group->rank(); }

void collective_bench::measure_round(const fit_options& options) {
  state_->group->set_emulation(options.emulation);
  // As OSU's and nccl-tests' loops do: `calls` back to back after a
  // barrier, the mean per call (what a step's collectives see one after
  // another, the ranks' skew included), one value per round.
  auto measure_one = [&](const std::string& name, std::uint64_t bytes, const std::function<void()>& call) {
    call();  // untimed: first-use costs (buffers, connections)
    const double seconds = state_->timed([&] {
      for (int c = 0; c < options.calls; ++c) call();
    });
    state_->times[{name, bytes}].push_back(seconds / options.calls);
  };
  auto measure_kind = [&](collective_kind kind, std::uint64_t bytes) {
    measure_one(loom::comm::name_of(kind), bytes, [&] { state_->run(kind, bytes); });
  };
  const bool raw_first = state_->rounds % 2 == 1;
  ++state_->rounds;
  for (const double size : options.payload_bytes) {
    const auto bytes = static_cast<std::uint64_t>(size);
    for (const auto kind : options.kinds) {
      if (kind == collective_kind::barrier) continue;
      const bool raw_here = options.raw_all_reduce && kind == collective_kind::all_reduce;
      auto raw = [&] { measure_one(raw_all_reduce_kind, bytes, [&] { state_->run_raw_all_reduce(bytes); }); };
      if (raw_here && raw_first) raw();
      measure_kind(kind, bytes);
      if (raw_here && !raw_first) raw();
    }
  }
  if (std::find(options.kinds.begin(), options.kinds.end(), collective_kind::barrier) != options.kinds.end()) {
    measure_kind(collective_kind::barrier, 0);
  }
}

std::vector<sample> collective_bench::samples() const {
  std::vector<sample> medians;
  if (rank() != 0) return medians;
  for (const auto& [key, values] : state_->times) {
    // The payload as run (a barrier carries none).
    const auto elements = key.second == 0 ? 0 : floats_for(key.second, ranks());
    medians.push_back({key.first, static_cast<double>(elements) * 4, spread_of(values).median});
  }
  return medians;
}

std::vector<sample> collective_bench::measure(const fit_options& options) {
  for (int round = 0; round < options.rounds; ++round) measure_round(options);
  return samples();
}

std::vector<double> collective_bench::sum_over_ranks(const std::vector<double>& values) {
  at::Tensor sums = at::empty({static_cast<std::int64_t>(values.size())}, at::kDouble);
  std::copy(values.begin(), values.end(), sums.data_ptr<double>());
  state_->group->all_reduce(sums);
  return {sums.data_ptr<double>(), sums.data_ptr<double>() + sums.numel()};
}

std::optional<std::size_t> collective_bench::plan_replay(const std::vector<loom::comm::traced_collective>& trace) {
  // Rank 0's trace to everyone: [count, then kind, payload, group size per collective].
  at::Tensor count = at::zeros({1}, at::kLong);
  if (rank() == 0) count[0] = static_cast<std::int64_t>(trace.size());
  state_->group->broadcast(count);
  const auto n = count.item<std::int64_t>();
  at::Tensor entries = at::zeros({std::max<std::int64_t>(n, 1), 3}, at::kLong);
  if (rank() == 0) {
    auto rows = entries.accessor<std::int64_t, 2>();
    for (std::int64_t i = 0; i < n; ++i) {
      const auto& entry = trace[static_cast<std::size_t>(i)];
      rows[i][0] = static_cast<std::int64_t>(entry.kind);
      rows[i][1] = static_cast<std::int64_t>(entry.payload_bytes);
      rows[i][2] = entry.group_size;
    }
  }
  state_->group->broadcast(entries);
  std::vector<loom::comm::traced_collective> plan;
  const auto rows = entries.accessor<std::int64_t, 2>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto kind = static_cast<collective_kind>(rows[i][0]);
    const bool runs = kind != collective_kind::gather && kind != collective_kind::scatter &&
                      kind != collective_kind::reduce && kind != collective_kind::all_to_all;
    if (!runs || rows[i][2] != ranks()) return std::nullopt;
    plan.push_back({kind, static_cast<std::uint64_t>(rows[i][1]), static_cast<int>(rows[i][2])});
  }
  state_->plans.push_back(std::move(plan));
  replay_once(state_->plans.size() - 1);  // untimed: first-use costs
  return state_->plans.size() - 1;
}

double collective_bench::replay_once(std::size_t plan) {
  const auto& steps = state_->plans.at(plan);
  return state_->timed([&] {
    for (const auto& step : steps) state_->run(step.kind, step.payload_bytes);
  }) * 1e3;
}

}  // namespace loom_bench
