// loom-bench's worker: on the processes a launcher started (loom-run,
// mpirun, torchrun, srun), every cell x precision of the run trains the same
// model side by side, interleaved in blocks of steps so that the machine's
// noise falls on all of them alike. Rank 0 returns what it measured.
#pragma once

#include "results.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace loom_bench {

struct worker_options {
  std::vector<std::int64_t> widths{784, 1024, 1024, 1024, 10};  // the MLP: input, hidden..., classes
  // Not empty: the model of this shared library (loom/util/bench_model.hpp)
  // instead of the MLP, with these options.
  std::string model_library;
  std::string model_options;
  std::string optimizer = "adam";  // adam (lr 1e-3) | sgd (lr 0.01, no momentum)
  std::int64_t batch_per_rank = 64;  // per data-parallel rank (model_parallel: per tensor-parallel group)
  int steps = 200;                   // measured per cell
  int warmup = 20;
  int block = 10;  // steps per cell before the next cell's turn
  int replays = 20;  // times each cell's step of collectives is replayed alone (more than one rank)
  // Not empty: rank 0 fits the network model to microbenchmarks run
  // between the replays and writes it here (loom-bench --network fit).
  std::string fit_network;
  std::vector<std::string> cells;
  std::vector<std::string> precisions{"32-true"};
};

// Every cell x precision; rank 0's results (the other ranks return none).
// A cell that cannot run (a name this build refuses, options it rejects)
// is a result with `refused` saying why, and the others still run.
std::vector<cell_result> run_cells(const worker_options& options);

}  // namespace loom_bench
