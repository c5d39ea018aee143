// loom-bench: what a strategy costs, for a model, on a number of ranks. A
// matrix of cells -- strategies (registered names, with options) x
// precisions x world sizes -- each training the same model side by side;
// per cell the step time (median, p10, p90), its split, throughput, and the
// ratios to the raw LibTorch loop and to single_device, communication
// (payload, wire bytes, time in flight, alone, and as the network model
// predicts it) and memory. Markdown tables on stdout, CSV and JSON files
// (docs/benchmarks.md).
//
//   loom-bench                                   every strategy and the PyTorch peers, 1 and 2 ranks
//   loom-bench --strategies ddp,fsdp --world-sizes 2,4 --precisions 32-true,bf16-mixed
//   loom-bench --one-rank-overhead               every strategy at one rank against single_device
//   loom-bench --world-sizes 2 --network fit --project NETWORK.json
//                                                the alpha-beta model: fitted, checked, projected
//   loom-bench --fit-network FILE                loom's collective microbenchmarks, fitted, to a file
//   loom-run --devices 2 bench [OPTIONS]         one world size, started by loom-run (or mpirun, torchrun)
//
// Started by a launcher, it is one world size's worker set and rank 0
// reports; otherwise it starts one worker set per world size through
// loom-run (installed beside it) and merges their results.
// (Not bench/loom_bench: that Google Benchmark binary keeps its name and its
// role, the paired per-step ratios against the raw loop.)
#include "bench/cell.hpp"
#include "bench/network_fit.hpp"
#include "bench/network_model.hpp"
#include "bench/network_report.hpp"
#include "bench/results.hpp"
#include "bench/worker.hpp"

#include <loom/cluster/environment.hpp>
#include <loom/comm/process_group.hpp>
#include <loom/environment.hpp>
#include <loom/launch/supervisor.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <filesystem>
#include <fstream>
#include <map>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

namespace {

struct arguments {
  std::string strategies;
  std::string precisions;
  std::string world_sizes = "1,2";
  std::string widths;
  std::string out = "loom-bench";
  std::string results;  // a worker set's results file (given by the driver)
  bool one_rank_overhead = false;
  std::string fit_network;   // --fit-network FILE: the collective microbenchmarks, fitted
  std::string network;       // --network FILE: predict each cell's communication time
  std::string project;       // --project FILE: the network to project onto
  std::string project_ranks = "8,16,32,64,128,256,512,1024";
  int rounds = 1;
  loom_bench::fit_options fit;  // --fit-network's microbenchmarks
  std::string fit_sizes;        // --fit-sizes: payload bytes, comma-separated
  std::string emulation = "point_to_point";
  std::string fit_kinds;        // --fit-kinds: names, comma-separated (default: every kind the model needs)
  std::string fit_backend = "gloo";
  loom_bench::worker_options worker;
  // Read once, while the arguments are checked.
  std::optional<loom_bench::network> network_file;  // --network FILE (not fit)
  std::optional<loom_bench::network> project_file;  // --project FILE
  std::vector<std::int64_t> project_rank_counts;
};

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ",") + item;
  return text;
}

// "AMD EPYC 7B13, 2 CPUs": what the report says it ran on.
std::string machine() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string model = "unknown CPU";
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " CPUs";
}

std::vector<std::int64_t> numbers(const std::string& text, const char* what) {
  std::vector<std::int64_t> values;
  for (const auto& item : loom_bench::split_list(text)) {
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || value < 1) {
      throw CLI::ValidationError(std::string(what) + ": '" + item + "' is not a positive whole number");
    }
    values.push_back(value);
  }
  if (values.empty()) throw CLI::ValidationError(std::string(what) + ": empty list");
  return values;
}

// The report: the table, the files, and what every run must say.
void report(std::vector<loom_bench::cell_result> results, const arguments& args,
            const std::map<int, loom_bench::network>& fitted = {}) {
  loom_bench::compare(results);
  // The network model per world size: fitted in the run, or the file's.
  std::map<int, loom_bench::network> models = fitted;
  if (args.network_file) {
    for (const auto& r : results) models.emplace(r.world_size, *args.network_file);
  }
  loom_bench::predict(results, models);
  // glibc's malloc settings change CPU step times by tens of percent
  // (docs/launching.md): the report names them.
  const std::string tunables = loom::cluster::setting_text("GLIBC_TUNABLES").value_or("");
  const std::string model = !results.empty() && !results.front().model.empty() ? results.front().model
                                                                               : "MLP " + args.widths;
  std::printf("loom-bench on %s; %s, batch %lld per data-parallel rank, %s, %d measured steps per cell "
              "(after %d), interleaved in blocks of %d; denormals flushed to zero in every cell; malloc: %s\n\n",
              machine().c_str(), model.c_str(), static_cast<long long>(args.worker.batch_per_rank),
              args.worker.optimizer == "sgd" ? "SGD (lr 0.01)" : "Adam (lr 1e-3)",
              args.worker.steps, args.worker.warmup, args.worker.block,
              tunables.empty() ? "glibc's defaults" : ("GLIBC_TUNABLES=" + tunables).c_str());
  std::ostringstream table;
  loom_bench::write_markdown(table, results);
  std::fputs(table.str().c_str(), stdout);
  if (!args.out.empty()) {
    std::filesystem::create_directories(args.out);
    std::ofstream csv(args.out + "/loom-bench.csv");
    loom_bench::write_csv(csv, results);
    std::ofstream json(args.out + "/loom-bench.json");
    loom_bench::write_json(json, results, machine());
    std::printf("\nwritten: %s/loom-bench.csv, %s/loom-bench.json\n", args.out.c_str(), args.out.c_str());
  }
  for (const auto& [world_size, net] : fitted) loom_bench::print_fit(net);
  if (!models.empty()) loom_bench::print_validation(results, models);
  if (args.project_file) loom_bench::print_projection(results, *args.project_file, args.project_rank_counts);
  if (args.one_rank_overhead) {
    const loom_bench::cell_result* worst = nullptr;
    for (const auto& r : results) {
      if (r.label == "raw" || r.label == "single_device" || !r.vs_single_device) continue;
      if (worst == nullptr || *r.vs_single_device > *worst->vs_single_device) worst = &r;
    }
    if (worst != nullptr) {
      std::printf("worst_one_rank_ratio=%.4f strategy=%s\n", *worst->vs_single_device, worst->label.c_str());
    }
  }
  std::fflush(stdout);
}

// --fit-network on the ranks a launcher started: rank 0 fits the model to
// the microbenchmarks, writes the network file and prints both.
int run_fit(const arguments& args) {
  const bool mpi = args.fit_backend == "mpi";
  loom_bench::collective_bench bench(mpi ? loom::comm::backend::mpi : loom::comm::backend::gloo);
  const auto samples = bench.measure(args.fit);
  if (samples.empty()) return 0;  // not rank 0
  const auto net = loom_bench::fit_network(
      samples, bench.ranks(),
      std::string(mpi ? "loom's MPI process group, " : "loopback: Gloo over 127.0.0.1, ") +
          std::to_string(bench.ranks()) + " ranks on " + machine() +
          (args.fit.emulation == loom::comm::emulation::alltoall ? ", all-gather and reduce-scatter on Gloo's "
                                                                    "alltoall and list all_gather"
                                                                  : "") +
          " (fitted by loom-bench --fit-network)");
  loom_bench::print_fit(net);
  std::ofstream out(args.fit_network);
  loom_bench::write_network(out, net);
  if (!out) throw std::runtime_error("the network file " + args.fit_network + " cannot be written");
  std::printf("\nwritten: %s (use it with loom-bench --network %s)\n", args.fit_network.c_str(),
              args.fit_network.c_str());
  std::fflush(stdout);
  return 0;
}

// This process is one rank of a worker set a launcher started.
int run_worker(const arguments& args) {
  if (!args.fit_network.empty()) return run_fit(args);
  loom_bench::worker_options worker = args.worker;
  // --network fit: the driver names the file; started by loom-run, a private one.
  bool own_file = false;
  if (args.network == "fit" && worker.fit_network.empty()) {
    own_file = true;  // rank 0 writes it, reads it back and removes it
    worker.fit_network = (std::filesystem::temp_directory_path() /
                          ("loom-bench-network-" + std::to_string(::getpid()) + ".json")).string();
  }
  const auto results = loom_bench::run_cells(worker);
  if (results.empty()) return 0;  // not rank 0
  if (!args.results.empty()) {
    std::ofstream out(args.results);
    loom_bench::write_json(out, results, machine());
    return out ? 0 : 1;
  }
  std::map<int, loom_bench::network> fitted;
  if (own_file && std::filesystem::exists(worker.fit_network)) {
    fitted.emplace(results.front().world_size, loom_bench::read_network(worker.fit_network));
    std::filesystem::remove(worker.fit_network);
  }
  report(results, args, fitted);
  return 0;
}

// Runs a job and reads the results file it writes; false (and a line on
// stderr) when it fails.
bool run_job(loom::launch::supervisor& job, const std::string& file, const std::string& what,
             std::vector<loom_bench::cell_result>& results) {
  const auto outcome = job.wait_all();
  std::ifstream in(file);
  if (outcome.exit_code != 0 || !in) {
    std::fprintf(stderr, "loom-bench: %s failed (%s)\n", what.c_str(),
                 outcome.description.empty() ? "no results" : outcome.description.c_str());
    return false;
  }
  for (auto& r : loom_bench::read_json(in)) results.push_back(std::move(r));
  return true;
}

// Why the PyTorch peers cannot run here (empty: they can): torch_peer.py
// beside this program (build) or in share/loom (installed), and
// /usr/bin/python3 able to import torch.
std::string peers_unavailable(const std::filesystem::path& script) {
  if (script.empty()) return "tools/bench/torch_peer.py is not beside loom-bench nor in share/loom";
  loom::launch::supervisor probe;
  probe.start(0, {"/usr/bin/python3", "-c", "import torch"}, {});
  if (probe.wait_all().exit_code != 0) return "/usr/bin/python3 cannot import torch (Debian's python3-torch)";
  return {};
}

std::filesystem::path peer_script(const std::filesystem::path& self) {
  for (const auto& candidate : {self.parent_path() / "torch_peer.py",
                                self.parent_path().parent_path() / "share" / "loom" / "torch_peer.py"}) {
    if (std::filesystem::exists(candidate)) return candidate;
  }
  return {};
}

// The PyTorch peers at one world size: N processes of torch_peer.py.
void run_peers(const arguments& args, const std::vector<std::string>& peers, std::int64_t world_size,
               const std::string& scratch, const std::string& unavailable, const std::filesystem::path& script,
               std::vector<loom_bench::cell_result>& results) {
  auto refuse = [&](const std::string& why) {
    for (const auto& precision : args.worker.precisions) {
      for (const auto& peer : peers) {
        loom_bench::cell_result r;
        r.label = peer;
        r.precision = precision;
        r.world_size = static_cast<int>(world_size);
        r.peer = true;
        r.refused = why;
        results.push_back(std::move(r));
      }
    }
  };
  if (!unavailable.empty()) return refuse(unavailable);
  const std::string file = scratch + "/peers-" + std::to_string(world_size) + ".json";
  const std::string port = std::to_string(loom::comm::find_free_port());
  // The threads loom-run gives loom's ranks: the user's OMP_NUM_THREADS, or the cores shared out.
  const std::string threads =
      loom::cluster::setting_text("OMP_NUM_THREADS")
          .value_or(std::to_string(loom::launch::threads_per_process(static_cast<int>(world_size))));
  loom::launch::supervisor job;
  for (std::int64_t rank = 0; rank < world_size; ++rank) {
    job.start(static_cast<int>(rank),
              {"/usr/bin/python3", script.string(), "--widths", args.widths, "--batch",
               std::to_string(args.worker.batch_per_rank), "--steps", std::to_string(args.worker.steps),
               "--warmup", std::to_string(args.worker.warmup), "--block", std::to_string(args.worker.block),
               "--cells", join(peers), "--results", file, "--optimizer", args.worker.optimizer},
              {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", std::to_string(world_size)},
               {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}, {"OMP_NUM_THREADS", threads}});
  }
  std::vector<loom_bench::cell_result> measured;
  if (!run_job(job, file, "the PyTorch peers at " + std::to_string(world_size) + " rank(s)", measured)) {
    return refuse("torch_peer.py failed (its output is above)");
  }
  // The peers run in 32-true; other precisions have none.
  for (const auto& precision : args.worker.precisions) {
    for (const auto& r : measured) {
      loom_bench::cell_result copy = r;
      copy.precision = precision;
      if (precision != "32-true") copy = {.label = r.label, .precision = precision, .world_size = r.world_size,
                                          .refused = "the PyTorch peers run in 32-true only"};
      copy.peer = true;
      results.push_back(std::move(copy));
    }
  }
}

// One world size's worker set, through loom-run beside this program; with
// `fit` (--network fit, 2 or more ranks) it fits the network model in the
// run, into `fitted` and OUT/network-N.json. False (and a line on stderr)
// when it fails.
bool run_worker_set(const arguments& args, const std::vector<std::string>& cells, std::int64_t world_size,
                    const std::string& scratch, bool fit, std::vector<loom_bench::cell_result>& results,
                    std::map<int, loom_bench::network>& fitted) {
  const std::string self = loom::launch::own_executable();
  const std::string loom_run = (std::filesystem::path(self).parent_path() / "loom-run").string();
  const std::string file = scratch + "/results-" + std::to_string(world_size) + ".json";
  const std::string fit_file = fit ? scratch + "/network-" + std::to_string(world_size) + ".json" : std::string();
  std::fprintf(stderr, "loom-bench: %lld rank(s): %zu cell(s)\n", static_cast<long long>(world_size),
               cells.size() * args.worker.precisions.size());
  loom::launch::supervisor job;
  job.start(0,
            {loom_run, "--accelerator", "cpu", "--devices", std::to_string(world_size), self, "--strategies",
             join(cells), "--precisions", join(args.worker.precisions), "--widths", args.widths, "--model-library",
             args.worker.model_library, "--model-options", args.worker.model_options, "--batch",
             std::to_string(args.worker.batch_per_rank), "--steps", std::to_string(args.worker.steps), "--warmup",
             std::to_string(args.worker.warmup), "--block", std::to_string(args.worker.block), "--replays",
             std::to_string(args.worker.replays), "--results", file, "--fit-in-run", fit_file, "--optimizer",
             args.worker.optimizer},
            {});
  if (!run_job(job, file, "the worker set of " + std::to_string(world_size) + " rank(s)", results)) return false;
  if (fit && std::filesystem::exists(fit_file)) {
    fitted.emplace(static_cast<int>(world_size), loom_bench::read_network(fit_file));
    if (!args.out.empty()) {
      std::filesystem::create_directories(args.out);
      std::filesystem::copy_file(fit_file, args.out + "/network-" + std::to_string(world_size) + ".json",
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }
  return true;
}

// One worker set per world size, through loom-run beside this program, and
// the PyTorch peers after it.
int run_driver(const arguments& args) {
  const std::string self = loom::launch::own_executable();
  const std::string loom_run = (std::filesystem::path(self).parent_path() / "loom-run").string();
  if (!args.fit_network.empty()) {
    const auto world_size = numbers(args.world_sizes, "--world-sizes").back();
    if (args.fit_backend == "mpi") {
      throw std::runtime_error("--fit-backend mpi: start loom-bench on its ranks with mpirun (mpirun -n 2 "
                               "loom-bench --fit-network FILE --fit-backend mpi)");
    }
    std::vector<std::string> command{loom_run, "--accelerator", "cpu", "--devices", std::to_string(world_size),
                                     self, "--fit-network", std::filesystem::absolute(args.fit_network).string(),
                                     "--fit-sizes", args.fit_sizes, "--emulation", args.emulation, "--fit-rounds",
                                     std::to_string(args.fit.rounds), "--fit-calls", std::to_string(args.fit.calls)};
    if (!args.fit_kinds.empty()) command.insert(command.end(), {"--fit-kinds", args.fit_kinds});
    if (args.fit.raw_all_reduce) command.emplace_back("--fit-raw-baseline");
    loom::launch::supervisor job;
    job.start(0, command, {});
    return job.wait_all().exit_code;
  }
  std::vector<std::string> cells;
  std::vector<std::string> peers;
  for (const auto& cell : args.worker.cells) (loom_bench::is_peer(cell) ? peers : cells).push_back(cell);
  const std::filesystem::path script = peer_script(self);
  const std::string unavailable =
      peers.empty()                         ? std::string()
      : !args.worker.model_library.empty() ? "the PyTorch peers train the built-in MLP only (no --model-library)"
                                            : peers_unavailable(script);
  const std::string scratch = loom::launch::make_private_directory("loom-bench-");
  std::vector<loom_bench::cell_result> results;
  std::map<int, loom_bench::network> fitted;
  int status = 0;
  // --rounds: loom's worker sets and the peers alternate, each cell's steps pooled.
  for (int round = 0; round < args.rounds; ++round) {
    for (const auto world_size : numbers(args.world_sizes, "--world-sizes")) {
      const bool fit = args.network == "fit" && world_size > 1 && round == 0;
      if (!cells.empty() && !run_worker_set(args, cells, world_size, scratch, fit, results, fitted)) status = 1;
      if (!peers.empty()) run_peers(args, peers, world_size, scratch, unavailable, script, results);
    }
  }
  loom::launch::remove_directory(scratch);
  if (results.empty()) return 1;
  report(loom_bench::merge_rounds(results), args, fitted);
  return status;
}

}  // namespace

// The arguments after parsing: defaults that depend on others, loom-run's
// choices, the lists and files read and checked. Throws
// CLI::ValidationError saying what is wrong.
void complete(arguments& args) {
  if (args.one_rank_overhead) {
    if (!args.strategies.empty() || !args.precisions.empty() || args.world_sizes != "1,2") {
      throw CLI::ValidationError("--one-rank-overhead runs its own cells at one rank in 32-true: leave "
                                 "--strategies, --precisions and --world-sizes out");
    }
    args.world_sizes = "1";
    args.worker.cells = loom_bench::one_rank_cells();
  }
  if (!args.fit_network.empty()) {
    if (!args.strategies.empty() || !args.network.empty() || !args.project.empty() || args.one_rank_overhead) {
      throw CLI::ValidationError("--fit-network measures collectives only: leave --strategies, --network, "
                                 "--project and --one-rank-overhead out (fit first, then run the matrix with "
                                 "--network FILE)");
    }
    if (args.world_sizes == "1,2") args.world_sizes = "2";
    if (!args.fit_sizes.empty()) {
      args.fit.payload_bytes.clear();
      for (const auto bytes : numbers(args.fit_sizes, "--fit-sizes")) {
        args.fit.payload_bytes.push_back(static_cast<double>(bytes));
      }
    }
    if (args.emulation == "alltoall") args.fit.emulation = loom::comm::emulation::alltoall;
    if (!args.fit_kinds.empty()) {
      // The kinds the microbenchmarks can run: the default list, every one.
      const auto measurable = std::exchange(args.fit.kinds, {});
      for (const auto& name : loom_bench::split_list(args.fit_kinds)) {
        const auto kind = loom_bench::kind_named(name);
        if (!kind || std::find(measurable.begin(), measurable.end(), *kind) == measurable.end()) {
          std::string accepted;
          for (const auto k : measurable) {
            accepted += std::string(accepted.empty() ? "" : ", ") + loom::comm::name_of(k);
          }
          throw CLI::ValidationError("--fit-kinds: '" + name + "' is not measured; accepted: " + accepted);
        }
        args.fit.kinds.push_back(*kind);
      }
    }
    if (args.fit.raw_all_reduce && args.fit_backend != "gloo") {
      throw CLI::ValidationError("--fit-raw-baseline compares with c10d's Gloo allreduce: leave --fit-backend mpi out");
    }
    if (numbers(args.world_sizes, "--world-sizes").back() < 2) {
      throw CLI::ValidationError("--fit-network needs 2 or more ranks (--world-sizes 2)");
    }
  }
  // A network file that cannot be used is refused before anything runs.
  try {
    if (!args.network.empty() && args.network != "fit") args.network_file = loom_bench::read_network(args.network);
    if (!args.project.empty()) args.project_file = loom_bench::read_network(args.project);
  } catch (const std::exception& error) {
    throw CLI::ValidationError(error.what());
  }
  args.project_rank_counts = numbers(args.project_ranks, "--project-ranks");
  // Under loom-run, its --strategy and --precision choose when these flags do not.
  const auto named_strategy = loom::cluster::setting_text("LT_STRATEGY");
  const auto named_precision = loom::cluster::setting_text("LT_PRECISION");
  if (!args.strategies.empty()) args.worker.cells = loom_bench::split_list(args.strategies);
  else if (named_strategy && !args.one_rank_overhead) args.worker.cells = {"raw", *named_strategy};
  else if (args.worker.cells.empty()) args.worker.cells = loom_bench::default_cells();
  if (!args.precisions.empty()) args.worker.precisions = loom_bench::split_list(args.precisions);
  else if (named_precision) args.worker.precisions = {*named_precision};
  if (args.widths.empty()) args.widths = "784,1024,1024,1024,10";
  // Every rank loads it from where the driver found it.
  if (!args.worker.model_library.empty()) {
    if (!std::filesystem::exists(args.worker.model_library)) {
      throw CLI::ValidationError("--model-library: " + args.worker.model_library + " does not exist");
    }
    args.worker.model_library = std::filesystem::absolute(args.worker.model_library).string();
  }
  args.worker.widths = numbers(args.widths, "--widths");
  if (args.worker.widths.size() < 2) throw CLI::ValidationError("--widths: at least an input and an output width");
  numbers(args.world_sizes, "--world-sizes");
}

int main(int argc, char** argv) {
  arguments args;
  CLI::App app("loom-bench: what each strategy costs for one model, side by side: step time (median, p10, p90) and "
               "its split, throughput, ratios to the raw LibTorch loop and to single_device.",
               "loom-bench");
  app.add_option("--strategies", args.strategies,
                 "cells, comma-separated: registered names, NAME+KEY=VALUE+... with the strategy's options "
                 "(docs/configuration.md), and 'raw' (the raw LibTorch loop); default: every name this build "
                 "runs on the CPU, fsdp in each sharding strategy, model_parallel and raw");
  app.add_option("--precisions", args.precisions, "precisions, comma-separated (default 32-true)");
  app.add_option("--model-library", args.worker.model_library,
                 "a shared library giving the model instead of the MLP (its loom_bench_model entry point: "
                 "loom/util/bench_model.hpp; e.g. build/examples/libloom_bench_char_transformer.so)");
  app.add_option("--model-options", args.worker.model_options, "the options the model library is given");
  app.add_option("--optimizer", args.worker.optimizer, "adam (lr 1e-3) or sgd (lr 0.01, no momentum), every cell's")
      ->check(CLI::IsMember({"adam", "sgd"}))->capture_default_str();
  app.add_option("--world-sizes", args.world_sizes, "ranks per worker set, comma-separated")->capture_default_str();
  app.add_option("--widths", args.widths, "the MLP's widths: input,hidden...,classes (default 784,1024,1024,1024,10)");
  app.add_option("--batch", args.worker.batch_per_rank, "samples per data-parallel rank and step")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", args.worker.steps, "measured steps per cell")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", args.worker.warmup, "steps per cell before measuring")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--block", args.worker.block, "steps a cell runs before the next cell's turn")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--rounds", args.rounds,
                 "times loom's worker sets and the PyTorch peers alternate (each round --steps per cell; the "
                 "figures over every round's steps)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--replays", args.worker.replays,
                 "times each cell's collectives of one step are replayed alone (more than one rank)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--out", args.out, "directory for loom-bench.csv and loom-bench.json ('' : none)")
      ->capture_default_str();
  app.add_flag("--one-rank-overhead", args.one_rank_overhead,
               "every strategy at one rank against single_device (MLP 784-1024x3-10, Adam, 32-true); ends with "
               "worst_one_rank_ratio=R strategy=NAME");
  app.add_option("--fit-network", args.fit_network,
                 "measure loom's collectives (all_reduce, all_gather, reduce_scatter, broadcast, barrier; 4 KiB to "
                 "16 MiB) on the largest of --world-sizes ranks (default 2), fit the alpha-beta model to them and "
                 "write it to this file; runs no cells");
  app.add_option("--fit-sizes", args.fit_sizes,
                 "--fit-network's payloads in bytes, comma-separated (default 4 KiB to 16 MiB, doubling)");
  app.add_option("--fit-rounds", args.fit.rounds, "--fit-network's rounds (each kind and payload once per round)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--fit-calls", args.fit.calls, "--fit-network's calls back to back per kind, payload and round")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--emulation", args.emulation,
                 "--fit-network: how all_gather and reduce_scatter run on Gloo: point_to_point (loom's exchange, "
                 "what strategies use) or alltoall (Gloo's alltoall and list all_gather)")
      ->check(CLI::IsMember({"point_to_point", "alltoall"}))->capture_default_str();
  app.add_option("--fit-kinds", args.fit_kinds,
                 "--fit-network's collectives, comma-separated (default all_reduce,all_gather,reduce_scatter,"
                 "broadcast,barrier: every kind the model needs)");
  app.add_flag("--fit-raw-baseline", args.fit.raw_all_reduce,
               "--fit-network: also c10d's own allreduce on the Gloo group under loom's, on the same buffer, next to "
               "loom's all_reduce in each round (samples of kind c10d_allreduce; bench/allreduce.sh)");
  app.add_option("--fit-backend", args.fit_backend,
                 "--fit-network's process group: gloo, or mpi (loom's MPI group; start loom-bench under mpirun)")
      ->check(CLI::IsMember({"gloo", "mpi"}))->capture_default_str();
  app.add_option("--network", args.network,
                 "'fit' (fit the alpha-beta model to loom's collective microbenchmarks in this run, interleaved "
                 "with the replays it is checked against; written to OUT/network-N.json), or a network file "
                 "(--fit-network's, or one describing another network): each cell's communication time per step as "
                 "the model predicts it, against its collectives replayed alone");
  app.add_option("--project", args.project,
                 "a network file describing a cluster (e.g. share/loom/networks/infiniband-200g.json): the model's "
                 "communication time per step at --project-ranks, printed as a projection");
  app.add_option("--project-ranks", args.project_ranks, "the rank counts of --project")->capture_default_str();
  app.add_option("--fit-in-run", args.worker.fit_network, "(set by loom-bench itself) --network fit's file")
      ->group("");
  app.add_option("--results", args.results, "(set by loom-bench itself) where a worker set writes its results")
      ->group("");
  try {
    app.parse(argc, argv);
    complete(args);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  try {
    const bool launched = loom::cluster::detect().world_size.has_value() || !args.results.empty();
    return launched ? run_worker(args) : run_driver(args);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "loom-bench: %s\n", error.what());
    return 1;
  }
}
