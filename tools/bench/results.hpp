// What loom-bench measured per cell, and the three ways it is reported: a
// Markdown table on stdout, CSV and JSON (also how a worker set hands its
// cells to the driver). No torch headers.
#pragma once

#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom_bench {

// The median, 10th and 90th percentile of a series of step times.
struct spread {
  double median = 0;
  double p10 = 0;
  double p90 = 0;
};
spread spread_of(std::vector<double> values);

// Every measured step's times (ms), what the medians are taken over: the
// driver pools them across rounds (--rounds).
struct step_samples {
  std::vector<double> step, forward, backward, optimizer;
  std::vector<double> off_cpu;  // the step's wall time the training thread did not run
};

// A cell's NVMe offload stream (loom/util/offload_io.hpp) over its measured
// steps: bytes per step and throughput (bytes / the time with at least one
// request of that kind in flight), MB/s (10^6 bytes); rank 0's, and the
// ranks' throughputs summed (under loom-run: the disk serves them at once).
struct offload_figures {
  double read_bytes_per_step = 0;
  double written_bytes_per_step = 0;
  double read_mb_per_s = 0;
  double write_mb_per_s = 0;
  std::optional<double> read_mb_per_s_all_ranks;
  std::optional<double> write_mb_per_s_all_ranks;
};

struct cell_result {
  std::string label;      // the cell as named ("fsdp+sharding_strategy=SHARD_GRAD_OP", "raw")
  std::string precision;  // "32-true", "bf16-mixed", ...
  int world_size = 1;
  std::string model;    // what it trained ("MLP 784,1024,1024,1024,10")
  std::string refused;  // not empty: the cell did not run, and why
  int steps = 0;        // measured steps (after the warm-up)
  spread step_ms;       // the whole step, on rank 0
  // Medians of the step's parts: forward (zero_grad, forward, loss), backward, optimizer step.
  double forward_ms = 0;
  double backward_ms = 0;
  double optimizer_ms = 0;
  // Median over steps of the wall time the training thread was off the CPU:
  // waiting on a collective (exposed communication) or for a core.
  double off_cpu_ms = 0;
  double samples_per_second = 0;  // all ranks
  double flop_per_second = 0;     // model FLOP (matrix products, forward and backward), all ranks
  double rss_peak_mib = 0;        // rank 0's process, all its cells (VmHWM)
  // Rank 0's collectives per step, every group together (loom/comm/traffic.hpp):
  // by kind ("all_gather" -> {collectives, payload bytes}), and the totals.
  std::map<std::string, std::pair<double, double>> collectives_by_kind;
  double collectives_per_step = 0;
  double payload_bytes_per_step = 0;
  std::optional<double> payload_formula_bytes;  // what the strategy's formula says (formulas.hpp)
  // Rank 0's collectives of one step after the measured ones, in the order
  // entered: {kind, payload bytes}.
  std::vector<std::pair<std::string, double>> step_collectives;
  // What rank 0 sends per step for that payload, estimated from the
  // algorithm each kind runs (network_model.hpp's algorithm_of), every
  // collective taken to span the world size.
  double wire_bytes_per_step = 0;
  // Communication time per step (mean): wall time while any of rank 0's
  // collectives was in flight (loom/comm/traffic.hpp), overlap counted once.
  double comm_in_flight_ms = 0;
  // The same step's collectives replayed alone, one after another, on a
  // group of the same ranks (median of --replays; more than one rank, under
  // loom-run): what the alpha-beta model predicts.
  std::optional<double> comm_alone_ms;
  // The alpha-beta model's time for this step's collectives (--network);
  // filled in by the driver.
  std::optional<double> predicted_comm_ms;
  // Rank 0's model state (parameters, gradients, optimizer state, the
  // engine's buffers): CPU tensor bytes held between steps (a counting
  // allocator), and what the strategy's formula says.
  double state_bytes = 0;
  std::optional<double> state_formula_bytes;
  std::optional<offload_figures> nvme;  // cells that offload to NVMe
  // Filled in by the driver: against the raw loop and single_device at the same
  // precision and world size 1 (no value: not measured in this run).
  std::optional<double> beyond_raw_ms;
  std::optional<double> vs_single_device;
  // Against the PyTorch peer of the same kind (ddp: torch_ddp,
  // deepspeed_stage_1: torch_zero1) at the same precision and world size.
  std::optional<double> vs_peer;
  bool peer = false;  // measured by PyTorch itself (tools/bench/torch_peer.py): no loom counters
  step_samples samples;
};

// The step figures of one cell from its samples: steps, step_ms, the parts'
// medians, and throughput (samples/s and FLOP/s scaled to the new median).
void summarize(cell_result& result);

// Cells measured in several rounds (the same label, precision and world
// size), one per cell: their steps pooled and summarized again; the counts
// (collectives, bytes, state) are the first round's (they do not change),
// the communication times the mean over the rounds, the RSS peak the most.
std::vector<cell_result> merge_rounds(const std::vector<cell_result>& results);

// The JSON write_json writes, read back (the driver merges its worker
// sets' files); throws std::runtime_error naming what it cannot read.
std::vector<cell_result> read_json(std::istream& in);

// Ratios and differences against the raw loop and single_device.
void compare(std::vector<cell_result>& results);

void write_markdown(std::ostream& out, const std::vector<cell_result>& results);
void write_csv(std::ostream& out, const std::vector<cell_result>& results);
void write_json(std::ostream& out, const std::vector<cell_result>& results, const std::string& machine);

}  // namespace loom_bench
