// loom-bench's cells: one strategy (a registered name, with options) at one
// precision, and how a command line names them. No torch headers.
//
//   fsdp                                  the name alone
//   fsdp+sharding_strategy=SHARD_GRAD_OP  the name and its options (keys of
//                                         docs/configuration.md), '+' apart
//   raw                                   no Fabric: the raw LibTorch loop
//   torch_ddp, torch_zero1                PyTorch itself (python3-torch)
#pragma once

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

}  // namespace loom_bench
