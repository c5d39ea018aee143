// loom-bench: what a strategy costs, for a model, on a number of ranks. A
// matrix of cells -- strategies (registered names, with options) x
// precisions x world sizes -- each training the same model side by side;
// per cell the step time (median, p10, p90), its split, throughput, and the
// ratios to the raw LibTorch loop and to single_device. A Markdown table on
// stdout, CSV and JSON files (docs/benchmarks.md).
//
//   loom-bench                                   every strategy, 1 and 2 ranks
//   loom-bench --strategies ddp,fsdp --world-sizes 2,4 --precisions 32-true,bf16-mixed
//   loom-bench --one-rank-overhead               every strategy at one rank against single_device
//   loom-run --devices 2 bench [OPTIONS]         one world size, started by loom-run (or mpirun, torchrun)
//
// Started by a launcher, it is one world size's worker set and rank 0
// reports; otherwise it starts one worker set per world size through
// loom-run (installed beside it) and merges their results.
// (Not bench/loom_bench: that Google Benchmark binary keeps its name and its
// role, the paired per-step ratios against the raw loop.)
#include "bench/cell.hpp"
#include "bench/results.hpp"
#include "bench/worker.hpp"

#include <loom/cluster/environment.hpp>
#include <loom/environment.hpp>
#include <loom/launch/supervisor.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct arguments {
  std::string strategies;
  std::string precisions;
  std::string world_sizes = "1,2";
  std::string widths;
  std::string out = "loom-bench";
  std::string results;  // a worker set's results file (given by the driver)
  bool one_rank_overhead = false;
  loom_bench::worker_options worker;
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
void report(std::vector<loom_bench::cell_result> results, const arguments& args) {
  loom_bench::compare(results);
  std::printf("loom-bench on %s; MLP %s, batch %lld per data-parallel rank, Adam, %d measured steps per cell "
              "(after %d), interleaved in blocks of %d; denormals flushed to zero in every cell\n\n",
              machine().c_str(), args.widths.c_str(), static_cast<long long>(args.worker.batch_per_rank),
              args.worker.steps, args.worker.warmup, args.worker.block);
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

// This process is one rank of a worker set a launcher started.
int run_worker(const arguments& args) {
  const auto results = loom_bench::run_cells(args.worker);
  if (results.empty()) return 0;  // not rank 0
  if (!args.results.empty()) {
    std::ofstream out(args.results);
    loom_bench::write_json(out, results, machine());
    return out ? 0 : 1;
  }
  report(results, args);
  return 0;
}

// One worker set per world size, through loom-run beside this program.
int run_driver(const arguments& args) {
  const std::string self = loom::launch::own_executable();
  const std::string loom_run = (std::filesystem::path(self).parent_path() / "loom-run").string();
  const std::string scratch = loom::launch::make_private_directory("loom-bench-");
  std::vector<loom_bench::cell_result> results;
  int status = 0;
  for (const auto world_size : numbers(args.world_sizes, "--world-sizes")) {
    const std::string file = scratch + "/results-" + std::to_string(world_size) + ".json";
    const std::vector<std::string> command{
        loom_run, "--accelerator", "cpu", "--devices", std::to_string(world_size), self,
        "--strategies", join(args.worker.cells), "--precisions", join(args.worker.precisions),
        "--widths", args.widths, "--batch", std::to_string(args.worker.batch_per_rank),
        "--steps", std::to_string(args.worker.steps), "--warmup", std::to_string(args.worker.warmup),
        "--block", std::to_string(args.worker.block), "--results", file};
    std::fprintf(stderr, "loom-bench: %lld rank(s): %zu cell(s)\n", static_cast<long long>(world_size),
                 args.worker.cells.size() * args.worker.precisions.size());
    loom::launch::supervisor job;
    job.start(0, command, {});
    const auto outcome = job.wait_all();
    std::ifstream in(file);
    if (outcome.exit_code != 0 || !in) {
      std::fprintf(stderr, "loom-bench: the worker set of %lld rank(s) failed (%s)\n",
                   static_cast<long long>(world_size),
                   outcome.description.empty() ? "no results" : outcome.description.c_str());
      status = 1;
      continue;
    }
    for (auto& r : loom_bench::read_json(in)) results.push_back(std::move(r));
  }
  loom::launch::remove_directory(scratch);
  if (results.empty()) return 1;
  report(std::move(results), args);
  return status;
}

}  // namespace

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
  app.add_option("--out", args.out, "directory for loom-bench.csv and loom-bench.json ('' : none)")
      ->capture_default_str();
  app.add_flag("--one-rank-overhead", args.one_rank_overhead,
               "every strategy at one rank against single_device (MLP 784-1024x3-10, Adam, 32-true); ends with "
               "worst_one_rank_ratio=R strategy=NAME");
  app.add_option("--results", args.results, "(set by loom-bench itself) where a worker set writes its results")
      ->group("");
  try {
    app.parse(argc, argv);
    if (args.one_rank_overhead) {
      if (!args.strategies.empty() || !args.precisions.empty() || args.world_sizes != "1,2") {
        throw CLI::ValidationError("--one-rank-overhead runs its own cells at one rank in 32-true: leave "
                                   "--strategies, --precisions and --world-sizes out");
      }
      args.world_sizes = "1";
      args.worker.cells = loom_bench::one_rank_cells();
    }
    // Under loom-run, its --strategy and --precision choose when these flags do not.
    const auto named_strategy = loom::cluster::setting_text("LT_STRATEGY");
    const auto named_precision = loom::cluster::setting_text("LT_PRECISION");
    if (!args.strategies.empty()) args.worker.cells = loom_bench::split_list(args.strategies);
    else if (named_strategy && !args.one_rank_overhead) args.worker.cells = {"raw", *named_strategy};
    else if (args.worker.cells.empty()) args.worker.cells = loom_bench::default_cells();
    if (!args.precisions.empty()) args.worker.precisions = loom_bench::split_list(args.precisions);
    else if (named_precision) args.worker.precisions = {*named_precision};
    if (args.widths.empty()) args.widths = "784,1024,1024,1024,10";
    args.worker.widths = numbers(args.widths, "--widths");
    if (args.worker.widths.size() < 2) throw CLI::ValidationError("--widths: at least an input and an output width");
    numbers(args.world_sizes, "--world-sizes");
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
