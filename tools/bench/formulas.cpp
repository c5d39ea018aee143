#include "formulas.hpp"

#include <string>

namespace loom_bench {

namespace {

// Bytes per element a precision stores and moves (formulas.hpp: e, g, r).
struct element_bytes {
  double stored;    // e: parameters, gradients, the optimizer's moments
  double gathered;  // g: fsdp's all-gathered parameters
  double reduced;   // r: fsdp's reduce-scatter (reduce_dtype)
  bool zero_16_bit;  // deepspeed's bf16/fp16 mode
};

std::optional<element_bytes> bytes_of(std::string_view precision) {
  if (precision == "32-true") return element_bytes{4, 4, 4, false};
  if (precision == "bf16-mixed" || precision == "16-mixed") return element_bytes{4, 4, 2, true};
  if (precision == "bf16-true") return element_bytes{2, 2, 2, true};
  return std::nullopt;
}

// Ψ and P_n of the model (elements).
struct parameter_counts {
  double psi = 0;
  double padded = 0;
};
double padded_to(std::int64_t numel, int n) { return static_cast<double>((numel + n - 1) / n * n); }
parameter_counts counts_of(const model_shape& shape, int n) {
  parameter_counts counts{static_cast<double>(shape.root_numel), padded_to(shape.root_numel, n)};
  for (const std::int64_t numel : shape.unit_numels) {
    counts.psi += static_cast<double>(numel);
    counts.padded += padded_to(numel, n);
  }
  return counts;
}

// The ZeRO stage a deepspeed cell runs (its name's, or its +stage= option).
char zero_stage(const cell& spec) {
  const std::string& name = spec.strategy;
  const char named = name == "deepspeed" ? '2' : name[std::string_view("deepspeed_stage_").size()];
  return spec.option("stage", std::string(1, named)).front();
}

bool is_fsdp(const cell& spec) { return spec.strategy == "fsdp" || spec.strategy == "fsdp_cpu_offload"; }
bool is_zero(const cell& spec) {
  return spec.strategy.rfind("deepspeed", 0) == 0 && spec.strategy.find("nvme") == std::string::npos;
}
bool runs_alone(const cell& spec, int world_size) {
  return spec.is_raw() || spec.strategy == "single_device" || spec.strategy == "parallel" || world_size == 1;
}

// The shard group's size of an fsdp cell, as the engine forms it:
// HYBRID_SHARD's device_mesh_shard when both halves of the mesh are given,
// else every rank (one node: HYBRID_SHARD shards over the node's ranks);
// nullopt when the mesh does not fit the ranks.
std::optional<int> shard_ranks(const cell& spec, int world_size) {
  const int replicas = std::stoi(spec.option("device_mesh_replicate", "0"));
  const int shards = std::stoi(spec.option("device_mesh_shard", "0"));
  if (spec.option("sharding_strategy", "FULL_SHARD") != "HYBRID_SHARD" || replicas == 0 || shards == 0) {
    return world_size;
  }
  if (replicas * shards != world_size) return std::nullopt;
  return shards;
}

// model_parallel's mesh, {data-parallel D, tensor-parallel T}, as the
// strategy forms it on one node (D 1 and T every rank unless given).
std::optional<std::pair<int, int>> tensor_mesh(const cell& spec, int world_size) {
  const int data = std::stoi(spec.option("data_parallel_size", "1"));
  const int tensor = std::stoi(spec.option("tensor_parallel_size", std::to_string(world_size)));
  if (data * tensor != world_size) return std::nullopt;
  return std::pair{data, tensor};
}

// This rank's tensor-parallel parameters (elements): column-wise layers
// (even index) split weight and bias, row-wise ones the weight only; with D
// data-parallel ranks, each layer's padded to a multiple of D and / D.
double tensor_parallel_parameters(const std::vector<std::int64_t>& widths, int data, int tensor) {
  double local = 0;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    const std::int64_t weight = widths[i] * widths[i + 1] / tensor;
    const std::int64_t bias = i % 2 == 1 ? widths[i + 1] : widths[i + 1] / tensor;
    const std::int64_t layer = weight + bias;
    local += static_cast<double>((layer + data - 1) / data * data) / data;
  }
  return local;
}

}  // namespace

double optimizer_state_bytes(std::string_view optimizer) { return optimizer == "sgd" ? 0 : 8; }

std::optional<double> state_formula(const cell& spec, const model_shape& shape, int world_size,
                                    std::string_view precision, double optimizer_bytes) {
  const auto bytes = bytes_of(precision);
  if (!bytes) return std::nullopt;
  const double e = bytes->stored;
  const double k = optimizer_bytes;
  const double per_parameter = 2 * e + k * e / 4;  // parameter, gradient, optimizer state
  const double n = world_size;
  const auto [psi, padded] = counts_of(shape, world_size);
  const std::string& name = spec.strategy;
  if (name.rfind("ddp", 0) == 0) {
    const bool find_unused = name == "ddp_find_unused_parameters_true" ||
                             spec.option("find_unused_parameters", "false") == "true";
    if (find_unused || world_size == 2 || e != 4) return std::nullopt;
    if (world_size == 1) return per_parameter * psi;
    return (12 + k) * psi;
  }
  if (is_zero(spec)) {
    const char stage = zero_stage(spec);
    if (bytes->zero_16_bit) {
      if (stage == '1') return 4 * padded + (4 + k) * padded / n;
      if (stage == '2') return 2 * padded + (6 + k) * padded / n;
      return (8 + k) * padded / n;
    }
    if (stage == '1') return 8 * padded + k * padded / n;
    if (stage == '2') return 4 * padded + (4 + k) * padded / n;
    return (8 + k) * padded / n;
  }
  if (runs_alone(spec, world_size)) return per_parameter * psi;
  if (is_fsdp(spec)) {
    const std::string sharding = spec.option("sharding_strategy", "FULL_SHARD");
    if (sharding == "NO_SHARD") return per_parameter * psi;
    const auto shards = shard_ranks(spec, world_size);
    if (!shards) return std::nullopt;
    const double sharded = counts_of(shape, *shards).padded;
    if (sharding == "SHARD_GRAD_OP") return e * sharded + (e + k * e / 4) * sharded / *shards;
    return per_parameter * sharded / *shards;
  }
  const auto& widths = shape.widths;
  if (name == "model_parallel" && !widths.empty() && widths.size() % 2 == 1) {
    const auto mesh = tensor_mesh(spec, world_size);
    if (!mesh) return std::nullopt;
    return per_parameter * tensor_parallel_parameters(widths, mesh->first, mesh->second);
  }
  return std::nullopt;
}

std::optional<double> payload_formula(const cell& spec, const model_shape& shape, int world_size, std::int64_t batch,
                                      std::string_view precision) {
  if (runs_alone(spec, world_size)) return 0.0;
  const auto bytes = bytes_of(precision);
  if (!bytes) return std::nullopt;
  const double g = bytes->gathered;
  const double r = bytes->reduced;
  const auto [psi, padded] = counts_of(shape, world_size);
  const std::string& name = spec.strategy;
  if (name.rfind("ddp", 0) == 0) {
    const bool find_unused = spec.option("find_unused_parameters", name == "ddp_find_unused_parameters_true"
                                                                       ? "true" : "false") == "true";
    return 4 * psi + (find_unused ? 4.0 * static_cast<double>(shape.parameter_tensors) : 0.0);
  }
  if (is_fsdp(spec)) {
    const std::string sharding = spec.option("sharding_strategy", "FULL_SHARD");
    if (sharding == "NO_SHARD") return 4 * psi;  // an all-reduce: 4 bytes per element as counted (formulas.hpp)
    if (sharding == "SHARD_GRAD_OP") return (g + r) * padded;
    const auto shards = shard_ranks(spec, world_size);
    if (!shards) return std::nullopt;
    const double sharded = counts_of(shape, *shards).padded;
    const bool replicated = *shards < world_size;
    // The root is gathered once (it stays gathered from forward to backward).
    return (2 * g + r) * sharded - g * padded_to(shape.root_numel, *shards) +
           (replicated ? 4 * sharded / *shards : 0.0);
  }
  if (is_zero(spec)) {
    const bool stage_3 = zero_stage(spec) == '3';
    const double root = padded_to(shape.root_numel, world_size);
    if (bytes->zero_16_bit) return stage_3 ? 8 * padded - 2 * root : 6 * padded;
    return stage_3 ? 12 * padded - 4 * root : 8 * padded;
  }
  const auto& widths = shape.widths;
  if (name == "model_parallel" && !widths.empty()) {
    const std::size_t layers = widths.size() - 1;
    const auto mesh = tensor_mesh(spec, world_size);
    if (!mesh || (precision != "32-true" && layers % 2 == 1)) return std::nullopt;
    double activations = 0;
    for (std::size_t i = 0; i < layers; ++i) {
      if (i % 2 == 1) activations += static_cast<double>(widths[i + 1]);  // row-wise output, forward
      else if (i > 0) activations += static_cast<double>(widths[i]);      // column-wise input gradient, backward
    }
    // An odd last layer is column-wise with its output all-gathered (forward).
    if (layers % 2 == 1) activations += static_cast<double>(widths.back());
    const double sharding = mesh->first > 1 ? (2 * g + r) * tensor_parallel_parameters(widths, mesh->first,
                                                                                          mesh->second) *
                                                  mesh->first
                                            : 0.0;
    return 4.0 * static_cast<double>(batch) * activations + sharding;
  }
  return std::nullopt;
}

}  // namespace loom_bench
