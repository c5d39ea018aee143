// The models loom-bench trains (loom/util/bench_model.hpp): the built-in
// MLP of given widths, or the family a user's shared library gives.
#pragma once

#include <loom/util/bench_model.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom_bench {

// The MLP of `widths` (input, hidden..., classes), ReLU between layers,
// cross-entropy over the classes. Each Linear is a loom::unit (what FSDP and
// ZeRO-3 shard and gather one at a time) of a loom::tp::Linear (what
// model_parallel's plan shards: layers alternate column- and row-wise,
// Megatron's pairing; an odd last layer is column-wise, its output
// gathered). Its batch: normal inputs and uniform classes, seeded by the
// data-parallel rank.
loom::bench::model_family mlp_family(const std::vector<std::int64_t>& widths);

// The family of the library at `path` (its loom_bench_model(options, ...)).
// The library stays loaded for the life of the process. Throws
// loom::configuration_error naming the library and what went wrong.
loom::bench::model_family library_family(const std::string& path, const std::string& options);

}  // namespace loom_bench
