#include "worker.hpp"

#include "cell.hpp"
#include "formulas.hpp"
#include "model_families.hpp"
#include "network_fit.hpp"
#include "network_model.hpp"

#include <loom/any_fabric.hpp>
#include <loom/cluster/environment.hpp>
#include <loom/comm/traffic.hpp>
#include <loom/errors.hpp>
#include <loom/runtime/make_fabric_with_strategy.hpp>
#include <loom/runtime/strategy_options.hpp>
#include <loom/strategy/model_parallel.hpp>
#include <loom/strategy/unit_layout.hpp>
#include <loom/util/counting_allocator.hpp>
#include <loom/util/flop_counter.hpp>
#include <loom/util/offload_io.hpp>
#include <loom/util/rss_peak.hpp>

#include <ATen/Context.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <ctime>
#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace loom_bench {

namespace {

using clock_type = std::chrono::steady_clock;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// This thread's CPU time (CLOCK_THREAD_CPUTIME_ID), in ms.
double thread_cpu_ms() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

// The optimizer every cell trains with (--optimizer): Adam (lr 1e-3) or
// plain SGD (lr 0.01, no momentum: no state).
std::shared_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        const std::vector<at::Tensor>& parameters) {
  if (name == "sgd") return std::make_shared<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.01));
  return std::make_shared<torch::optim::Adam>(parameters, torch::optim::AdamOptions(1e-3));
}

// One cell at one precision: its fabric, model and optimizer, and its step.
struct runner {
  cell spec;
  cell_result result;
  int data_parallel_size = 1;  // ranks that each train on their own batch
  int global_rank = -1;        // as the cell's fabric says (-1: no fabric)
  std::function<void(step_samples*)> step;
  step_samples times;
  loom::comm::traffic traffic;  // over the measured steps
  loom::offload_io io;          // over the measured steps (NVMe offload)
};

using loom::bench::batch;

// One step, timed in its three parts: forward (zero_grad, forward and
// loss) returns the loss, backward takes it, then the optimizer steps.
template <class Forward, class Backward, class Step>
void timed_step(step_samples* times, Forward&& forward, Backward&& backward, Step&& step) {
  const double cpu0 = thread_cpu_ms();
  const auto t0 = clock_type::now();
  const at::Tensor loss = forward();
  const auto t1 = clock_type::now();
  backward(loss);
  const auto t2 = clock_type::now();
  step();
  const auto t3 = clock_type::now();
  const double cpu3 = thread_cpu_ms();
  if (times != nullptr) {
    times->off_cpu.push_back(std::max(0.0, ms_between(t0, t3) - (cpu3 - cpu0)));
    times->step.push_back(ms_between(t0, t3));
    times->forward.push_back(ms_between(t0, t1));
    times->backward.push_back(ms_between(t1, t2));
    times->optimizer.push_back(ms_between(t2, t3));
  }
}

// A step through fabric. The wrapped model and optimizer refer to the
// user's, which the step keeps alive.
template <class Model, class Optimizer>
std::function<void(step_samples*)> fabric_step(std::shared_ptr<loom::AnyFabric> fabric,
                                             std::shared_ptr<loom::bench::Model> net,
                                             std::shared_ptr<torch::optim::Optimizer> user_optimizer,
                                             std::shared_ptr<Model> model,
                                             std::shared_ptr<Optimizer> optimizer, batch data,
                                             std::shared_ptr<const loom::bench::model_family> family) {
  return [fabric, net, user_optimizer, model, optimizer, data, family](step_samples* times) {
    timed_step(
        times,
        [&] {
          optimizer->zero_grad();
          return family->loss((*model)(data.inputs), data.targets);
        },
        [&](const at::Tensor& loss) { fabric->backward(loss); }, [&] { optimizer->step(); });
  };
}

// The raw LibTorch loop: the same model, optimizer and batch, no Fabric.
void make_raw(runner& r, const worker_options& options, const std::shared_ptr<const loom::bench::model_family>& family,
              int rank) {
  if (r.result.precision != "32-true") {
    r.result.refused = "the raw LibTorch loop runs in 32-true only (compare with single_device at this precision)";
    return;
  }
  at::manual_seed(0);
  auto net = std::make_shared<loom::bench::Model>(family->build());
  auto optimizer = make_optimizer(options.optimizer, (*net)->parameters());
  const batch data = family->make_batch(options.batch_per_rank, rank);
  r.step = [net, optimizer, data, family](step_samples* times) {
    timed_step(
        times,
        [&] {
          optimizer->zero_grad();
          return family->loss((*net)->forward(data.inputs), data.targets);
        },
        [](const at::Tensor& loss) { loss.backward(); }, [&] { optimizer->step(); });
  };
}

// A registered name through make_fabric; model_parallel (its plan is code)
// as a strategy object, with data_parallel_size and tensor_parallel_size
// read from the cell's options. Each data-parallel rank trains on its own
// batch (model_parallel's tensor-parallel ranks share theirs).
void make_fabric_cell(runner& r, const worker_options& options,
                      const std::shared_ptr<const loom::bench::model_family>& family, int local_processes) {
  loom::fabric_config config;
  config.accelerator = "cpu";
  config.devices = local_processes;  // what the launcher started on this node
  config.precision = r.result.precision;
  std::shared_ptr<loom::AnyFabric> fabric;
  // model_parallel's plan says this rank's data-parallel coordinate and size.
  auto mesh = std::make_shared<std::optional<std::pair<int, int>>>();
  if (r.spec.strategy == "model_parallel") {
    if (!family->parallelize) {
      throw loom::configuration_error("model_parallel needs a plan: the model library gives no parallelize "
                                      "(loom/util/bench_model.hpp)");
    }
    loom::runtime::option_reader reader("model_parallel", r.spec.options_json);
    std::int64_t data_parallel = 0;
    std::int64_t tensor_parallel = 0;
    reader.read("data_parallel_size", data_parallel, 0, 1 << 20);
    reader.read("tensor_parallel_size", tensor_parallel, 0, 1 << 20);
    reader.finish();
    fabric.reset(new loom::AnyFabric(loom::make_fabric(  // not movable: built in place
        config, loom::model_parallel(loom::model_parallel_options{
                    .parallelize_fn =
                        [mesh, family](torch::nn::Module& module, loom::comm::device_mesh& device_mesh) {
                          *mesh = {device_mesh.coordinate("data_parallel"), device_mesh.size("data_parallel")};
                          family->parallelize(module, device_mesh);
                        },
                    .data_parallel_size = static_cast<int>(data_parallel),
                    .tensor_parallel_size = static_cast<int>(tensor_parallel)}))));
  } else {
    config.strategy = r.spec.strategy;
    config.strategy_options = r.spec.options_json;
    fabric.reset(new loom::AnyFabric(loom::make_fabric(config)));
  }
  fabric->launch();
  at::manual_seed(0);
  auto net = std::make_shared<loom::bench::Model>(family->build());
  auto user_optimizer = make_optimizer(options.optimizer, (*net)->parameters());
  auto [model, optimizer] = fabric->setup(*net, *user_optimizer);
  r.global_rank = fabric->global_rank();
  const auto [data_parallel_rank, data_parallel_size] =
      mesh->value_or(std::pair<int, int>{r.global_rank, fabric->world_size()});
  r.data_parallel_size = data_parallel_size;
  r.step = fabric_step(fabric, net, user_optimizer, std::make_shared<decltype(model)>(std::move(model)),
                       std::make_shared<decltype(optimizer)>(std::move(optimizer)),
                       family->make_batch(options.batch_per_rank, data_parallel_rank), family);
}

// The model FLOP of one step at the per-rank batch (forward and backward
// matrix products), counted once on a plain copy of the model.
double step_flop(const worker_options& options, const loom::bench::model_family& family,
                 loom::bench::model& plain) {
  const batch data = family.make_batch(options.batch_per_rank, 0);
  const auto counted = loom::measure_flops(
      plain, [&]() { return plain.forward(data.inputs); },
      [&](const at::Tensor& output) { return family.loss(output, data.targets); });
  return counted.total();
}

// A cell's NVMe figures over its measured steps, when it moved bytes; with
// `ranks` (more than one rank), the throughputs summed over them (every
// rank calls it for every cell, in the same order).
void nvme_figures(runner& r, int steps, collective_bench* ranks) {
  const auto mb_per_s = [](std::uint64_t bytes, std::uint64_t ns) {
    return ns == 0 ? 0.0 : static_cast<double>(bytes) / 1e6 / (static_cast<double>(ns) / 1e9);
  };
  const double read = mb_per_s(r.io.bytes_read, r.io.read_busy_ns);
  const double write = mb_per_s(r.io.bytes_written, r.io.write_busy_ns);
  std::vector<double> sums;
  if (ranks != nullptr) sums = ranks->sum_over_ranks({read, write});
  if (r.io.bytes_read + r.io.bytes_written == 0) return;
  offload_figures figures{.read_bytes_per_step = static_cast<double>(r.io.bytes_read) / steps,
                          .written_bytes_per_step = static_cast<double>(r.io.bytes_written) / steps,
                          .read_mb_per_s = read,
                          .write_mb_per_s = write};
  if (!sums.empty()) {
    figures.read_mb_per_s_all_ranks = sums[0];
    figures.write_mb_per_s_all_ranks = sums[1];
  }
  r.result.nvme = figures;
}

// What the formulas need of the model (formulas.hpp), read from a plain
// copy: its units' sizes (loom/strategy/unit_layout.hpp) and parameter
// tensors; the MLP's widths for model_parallel's.
model_shape shape_of(const worker_options& options, loom::bench::model& plain) {
  model_shape shape;
  const auto units = loom::unit_parameters(plain);
  for (std::size_t u = 0; u < units.size(); ++u) {
    std::int64_t numel = 0;
    for (const auto& p : units[u]) numel += p.numel();
    shape.parameter_tensors += static_cast<std::int64_t>(units[u].size());
    if (u == 0) shape.root_numel = numel;
    else if (numel > 0) shape.unit_numels.push_back(numel);
  }
  if (options.model_library.empty()) shape.widths = options.widths;
  return shape;
}

}  // namespace

std::vector<cell_result> run_cells(const worker_options& options) {
  const loom::cluster::cluster_info job = loom::cluster::detect();
  const int world_size = job.world_size.value_or(1);
  // Until a fabric says (loom-run leaves the global rank to the strategy):
  // the rank on a single node, for the raw loop's batch.
  int rank = job.global_rank.value_or(job.node_rank * job.local_world_size.value_or(world_size) + job.local_rank);
  // Each cell's Fabric forms its own process group. loom-run's rendezvous
  // (a file in a private directory) takes any number; a TCP one (mpirun,
  // torchrun, srun: MASTER_PORT) binds its port once per process, and a
  // second group would leave the other ranks waiting: refused up front.
  const auto fabrics = std::count_if(options.cells.begin(), options.cells.end(), [](const std::string& text) {
    return !is_peer(text) && text != raw_loop;
  });
  if (world_size > 1 && !job.rendezvous_dir && fabrics > 1) {
    throw loom::configuration_error(
        "loom-bench: under " + job.name + " (a TCP rendezvous at MASTER_PORT) a job runs one loom cell besides raw; "
        "name one with --strategies, or start loom-bench with loom-run (loom-run --devices N bench ...), whose "
        "rendezvous takes every cell");
  }
  // The cells join the processes the launcher started under their own
  // names: loom-run's --strategy (if any) names none of them.
  loom::cluster::export_variable("LT_CLI_USED", "");
  // Steps on one fixed batch drive gradients to denormal floats after some
  // tens of steps, whose x86 arithmetic is many times slower: the timings
  // would measure microcode assists, not strategies. Flushed, as
  // bench/zero_vs_torch.sh does on both sides (the report says so).
  at::globalContext().setFlushDenormal(true);
  // Communication time: while any collective of this process is in flight.
  loom::comm::time_collectives(true);

  // Every CPU tensor from here on is counted: a cell's model state is what
  // stays allocated after its setup and two steps (the optimizer's state exists
  // from the first), less its batch.
  const auto family = std::make_shared<const loom::bench::model_family>(
      options.model_library.empty() ? mlp_family(options.widths)
                                    : library_family(options.model_library, options.model_options));
  loom::counting_allocator& counter = loom::install_counting_allocator();
  // A cell holds its batch besides its model state (the same bytes for every rank).
  const std::int64_t batch_bytes = [&] {
    const batch sample = family->make_batch(options.batch_per_rank, 0);
    return static_cast<std::int64_t>(sample.inputs.nbytes() + sample.targets.nbytes());
  }();
  std::vector<runner> runners;
  for (const auto& precision : options.precisions) {
    for (const auto& text : options.cells) {
      const std::int64_t before = counter.live();
      runner r;
      r.result.label = text;
      r.result.precision = precision;
      r.result.world_size = world_size;
      try {
        r.spec = parse_cell(text);
        if (is_peer(text)) {
          r.result.peer = true;
          r.result.refused = "the PyTorch peers run from loom-bench's driver (loom-bench without a launcher)";
        } else if (r.spec.is_raw()) make_raw(r, options, family, rank);
        else if (r.spec.strategy == "single_device" && world_size > 1) {
          r.result.refused = "single_device runs one process (it is the 1-rank reference)";
        } else make_fabric_cell(r, options, family, job.local_world_size.value_or(world_size));
        if (r.step) {
          for (int s = 0; s < 2; ++s) r.step(nullptr);
          r.result.state_bytes = static_cast<double>(counter.live() - before - batch_bytes);
        }
      } catch (const std::exception& error) {
        r.result.refused = error.what();
      }
      runners.push_back(std::move(r));
    }
  }
  for (const auto& r : runners) {
    if (r.global_rank >= 0) {
      rank = r.global_rank;
      break;
    }
  }
  // One plain copy of the model: the formulas' shape and the FLOP of a step.
  at::manual_seed(0);
  const std::shared_ptr<loom::bench::model> plain = family->build();
  const model_shape shape = shape_of(options, *plain);
  const double flop = step_flop(options, *family, *plain);
  for (auto& r : runners) {
    if (!r.step) continue;
    for (int s = 0; s < options.warmup; ++s) r.step(nullptr);
  }
  for (int done = 0; done < options.steps; done += options.block) {
    for (auto& r : runners) {
      if (!r.step) continue;
      const auto before = loom::comm::traffic_so_far();
      const auto io_before = loom::offload_io_so_far();
      for (int s = 0; s < options.block && done + s < options.steps; ++s) r.step(&r.times);
      r.traffic += loom::comm::traffic_so_far() - before;
      r.io += loom::offload_io_so_far() - io_before;
    }
  }
  // Each cell's collectives of one step, in order, and (loom-run's
  // rendezvous: a TCP one forms one group per job) replayed alone on a
  // group of their own, in rounds; with --network fit, each round also
  // runs the microbenchmarks the model is fitted from.
  std::unique_ptr<collective_bench> bench;
  if (world_size > 1 && job.rendezvous_dir) bench = std::make_unique<collective_bench>();
  std::vector<std::pair<runner*, std::size_t>> plans;
  for (auto& r : runners) {
    if (!r.step) continue;
    std::vector<loom::comm::traced_collective> trace;
    loom::comm::trace_collectives(&trace);
    r.step(nullptr);
    loom::comm::trace_collectives(nullptr);
    for (const auto& entry : trace) {
      r.result.step_collectives.emplace_back(loom::comm::name_of(entry.kind), static_cast<double>(entry.payload_bytes));
    }
    if (!bench) continue;
    if (auto plan = bench->plan_replay(trace)) plans.emplace_back(&r, *plan);
  }
  if (bench) {
    const fit_options round{.calls = 4};
    std::vector<std::vector<double>> replayed(plans.size());
    for (int round_number = 0; round_number < options.replays; ++round_number) {
      if (!options.fit_network.empty()) bench->measure_round(round);
      for (std::size_t p = 0; p < plans.size(); ++p) replayed[p].push_back(bench->replay_once(plans[p].second));
    }
    for (std::size_t p = 0; p < plans.size(); ++p) plans[p].first->result.comm_alone_ms = spread_of(replayed[p]).median;
    if (!options.fit_network.empty() && bench->rank() == 0) {
      const auto net = fit_network(bench->samples(), world_size,
                                   "loopback: Gloo over 127.0.0.1, " + std::to_string(world_size) +
                                       " ranks (fitted by loom-bench from its microbenchmarks, interleaved with the "
                                       "replays it is validated against)");
      std::ofstream out(options.fit_network);
      write_network(out, net);
      if (!out) throw std::runtime_error("loom-bench: " + options.fit_network + " cannot be written");
    }
  }
  for (auto& r : runners) {
    if (r.step) nvme_figures(r, options.steps, bench.get());  // summed over the ranks where a group is formed
  }
  std::vector<cell_result> results;
  if (rank != 0) return results;
  const double rss = static_cast<double>(loom::rss_peak_bytes()) / (1 << 20);
  for (auto& r : runners) {
    cell_result result = r.result;
    if (r.step) {
      result.samples = r.times;
      summarize(result);
      const double seconds = result.step_ms.median / 1e3;
      result.samples_per_second = static_cast<double>(options.batch_per_rank * r.data_parallel_size) / seconds;
      result.flop_per_second = flop * r.data_parallel_size / seconds;
      const double steps = result.steps;
      for (std::size_t k = 0; k < loom::comm::collective_kinds; ++k) {
        const auto& count = r.traffic.by_kind[k];
        if (count.collectives == 0) continue;
        result.collectives_by_kind[loom::comm::name_of(static_cast<loom::comm::collective_kind>(k))] = {
            count.collectives / steps, count.payload_bytes / steps};
      }
      result.collectives_per_step = r.traffic.total().collectives / steps;
      result.payload_bytes_per_step = r.traffic.total().payload_bytes / steps;
      result.wire_bytes_per_step = wire_bytes(result.collectives_by_kind, world_size);
      result.comm_in_flight_ms = static_cast<double>(r.traffic.in_flight_ns) / 1e6 / steps;
      // The formulas (formulas.hpp) for the model's shape (a library's model:
      // none for model_parallel, whose plan is the library's).
      result.payload_formula_bytes =
          payload_formula(r.spec, shape, world_size, options.batch_per_rank, result.precision);
      result.state_formula_bytes =
          state_formula(r.spec, shape, world_size, result.precision, optimizer_state_bytes(options.optimizer));
    }
    result.rss_peak_mib = rss;
    result.model = family->description;
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace loom_bench
