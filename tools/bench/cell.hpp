// loom-bench's cells: one strategy (a registered name, with options) at one
// precision, and how a command line names them. No torch headers.
//
//   fsdp                                  the name alone
//   fsdp+sharding_strategy=SHARD_GRAD_OP  the name and its options (keys of
//                                         docs/configuration.md), '+' apart
//   raw                                   no Fabric: the raw LibTorch loop
//   torch_ddp, torch_zero1                PyTorch itself (python3-torch)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom_bench {

// The label of the raw LibTorch loop (the same model, optimizer and batch,
// no Fabric and no collective): every cell's compute-only reference.
inline constexpr std::string_view raw_loop = "raw";

struct cell {
  std::string label;         // as written: "fsdp+sharding_strategy=SHARD_GRAD_OP"
  std::string strategy;      // "fsdp"
  std::string options_json;  // {"sharding_strategy": "SHARD_GRAD_OP"}; empty: none
  std::vector<std::pair<std::string, std::string>> options;  // as written: {"sharding_strategy", "SHARD_GRAD_OP"}
  bool is_raw() const { return label == raw_loop; }
  // The value written for key, or `otherwise`.
  std::string option(std::string_view key, std::string_view otherwise) const;
};

// One item of --strategies. Throws loom::configuration_error on an option
// that is not key=value.
cell parse_cell(std::string_view text);
// A comma-separated list, in order.
std::vector<std::string> split_list(std::string_view text);

// Every registered name this build can run on the CPU with one model and an
// optimizer through make_fabric, each sharding strategy of fsdp and every
// ZeRO stage (the names a matrix runs when --strategies is not given).
std::vector<std::string> default_cells();
// The PyTorch peers (tools/bench/torch_peer.py, through /usr/bin/python3):
// torch_ddp (DDP + Adam) and torch_zero1 (DDP + ZeroRedundancyOptimizer).
// The driver runs them in their own processes after loom's cells of the
// same world size, at 32-true.
bool is_peer(std::string_view label);

// What --one-rank-overhead runs: every strategy against single_device.
std::vector<std::string> one_rank_cells();

// The payload bytes per step a cell's collectives must carry (the
// recording process group's count, loom/comm/traffic.hpp) on an MLP of
// these widths, at 32-true, with N ranks and `batch` samples per rank. Ψ is
// the parameter count, P = 4 bytes x the sum over units (each Linear) of its
// parameters padded to a multiple of N (a unit's flat shard):
//   raw, single_device, parallel, any cell at N = 1: 0
//   ddp: 4Ψ (gradient buckets all-reduced); find_unused_parameters=true:
//     + 4 bytes per parameter tensor (the Reducer's used-parameter map)
//   fsdp NO_SHARD: 4Ψ
//   fsdp FULL_SHARD (and HYBRID_SHARD on one replica), ZeRO-3: 3P
//     (all-gather in forward and again in backward, reduce-scatter)
//   fsdp SHARD_GRAD_OP, ZeRO-1 and -2: 2P (all-gather once, reduce-scatter)
//   model_parallel, tensor parallel N on one data-parallel rank: 4 x batch
//     x (the row-wise layers' outputs, all-reduced in forward, + the
//     column-wise layers' inputs but the first's, all-reduced in backward,
//     + an odd last layer's output, all-gathered in forward)
// No value where no formula is written yet (other precisions, 2-D meshes).
//
// state_formula: the bytes of model state a rank holds between steps
// (parameters, gradients, the optimizer's state: K bytes per parameter,
// Adam's two moments 8, plain SGD's none 0; the engine's flat buffers), at
// 32-true, with Ψ and P (in elements here) as above; with Adam (K = 8):
//   raw, single_device, parallel, fsdp NO_SHARD, any cell at N = 1:
//     (8 + K)Ψ = 16Ψ
//   fsdp FULL_SHARD (HYBRID_SHARD on one replica), ZeRO-3: (8 + K)P/N = 16P/N
//   fsdp SHARD_GRAD_OP, ZeRO-2: 4P + (4 + K)P/N = 4P + 12P/N (full
//     parameters kept, in the units' padded flat buffers)
//   ZeRO-1: 8P + KP/N = 8P + 8P/N (full parameters and gradients kept, padded)
//   model_parallel, tensor parallel N on one data-parallel rank, an even
//     number of layers: (8 + K) = 16 x this rank's parameters (column-wise layers:
//     weight and bias / N; row-wise: weight / N, the bias whole). The
//     tensor-parallel group may also keep a pooled receive buffer of one
//     activation (batch x width floats; measured: 0 or 1 KiB at batch 8,
//     width 32, from run to run), which the formula leaves out
// ddp has none yet: its Reducer's bucket copies of the gradients (4Ψ), the
// two-rank exchange's receive buffer (the bucket layout's) and, with
// find_unused_parameters, its used-parameter maps (even at one rank).
std::optional<double> state_formula(const cell& spec, const std::vector<std::int64_t>& widths, int world_size,
                                    std::string_view precision, double optimizer_bytes);
// K: the optimizer's state bytes per parameter (adam: 8, sgd: 0).
double optimizer_state_bytes(std::string_view optimizer);
std::optional<double> payload_formula(const cell& spec, const std::vector<std::int64_t>& widths, int world_size,
                                      std::int64_t batch, std::string_view precision);

}  // namespace loom_bench
