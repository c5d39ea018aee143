// loom-bench's network model in the report: the fit and its samples, each
// cell's predicted communication time against its collectives replayed
// alone, and the projection past this machine. No torch headers.
#pragma once

#include "network_model.hpp"
#include "results.hpp"

#include <cstdint>
#include <map>
#include <vector>

namespace loom_bench {

// Each loom cell's predicted_comm_ms at 2 or more ranks, from the model of
// its world size (models: by world size; a cell without one gets none).
void predict(std::vector<cell_result>& results, const std::map<int, network>& models);

// A fitted network: its samples against the model, and each kind's regimes.
void print_fit(const network& net);

// The model against the replay, per cell with collectives at more than one
// rank, with the in-situ figures beside it; ends with
//   alpha_beta_within_25pct=K/M worst_ratio=R cell=NAME
void print_validation(const std::vector<cell_result>& results, const std::map<int, network>& models);

// The model's communication time per step on a described network at each of
// `ranks`, from each cell's collectives of one step as recorded at the
// largest world size measured; labelled a projection.
void print_projection(const std::vector<cell_result>& results, const network& net,
                      const std::vector<std::int64_t>& ranks);

}  // namespace loom_bench
