#include "cell.hpp"

#include <loom/errors.hpp>
#include <loom/runtime/names.hpp>

#include <cctype>

namespace loom_bench {

namespace {

// A value as JSON: numbers and true/false as they are, anything else a string.
std::string json_value(std::string_view value) {
  if (value == "true" || value == "false") return std::string(value);
  bool number = !value.empty();
  for (std::size_t i = 0; i < value.size(); ++i) {
    const char c = value[i];
    number = number && (std::isdigit(static_cast<unsigned char>(c)) || c == '.' || (c == '-' && i == 0));
  }
  if (number) return std::string(value);
  std::string quoted = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> items;
  while (!text.empty()) {
    const auto comma = text.find(',');
    const auto item = text.substr(0, comma);
    if (!item.empty()) items.emplace_back(item);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return items;
}

cell parse_cell(std::string_view text) {
  cell parsed;
  parsed.label = std::string(text);
  const auto plus = text.find('+');
  parsed.strategy = std::string(text.substr(0, plus));
  if (plus == std::string_view::npos) return parsed;
  std::string json = "{";
  std::string_view rest = text.substr(plus + 1);
  while (true) {
    const auto next = rest.find('+');
    const auto option = rest.substr(0, next);
    const auto equals = option.find('=');
    if (equals == std::string_view::npos || equals == 0) {
      throw loom::configuration_error("loom-bench: cell '" + parsed.label + "': option '" + std::string(option) +
                                      "' is not KEY=VALUE (a cell is NAME or NAME+KEY=VALUE+..., the keys of "
                                      "docs/configuration.md)");
    }
    parsed.options.emplace_back(option.substr(0, equals), option.substr(equals + 1));
    if (json.size() > 1) json += ", ";
    json += "\"" + std::string(option.substr(0, equals)) + "\": " + json_value(option.substr(equals + 1));
    if (next == std::string_view::npos) break;
    rest.remove_prefix(next + 1);
  }
  parsed.options_json = json + "}";
  return parsed;
}

std::string cell::option(std::string_view key, std::string_view otherwise) const {
  for (const auto& [name, value] : options) {
    if (name == key) return value;
  }
  return std::string(otherwise);
}

namespace {

// Ψ and P of the MLP at N ranks (elements).
struct parameter_counts {
  double psi = 0;
  double padded = 0;
};
parameter_counts counts_of(const std::vector<std::int64_t>& widths, int world_size) {
  parameter_counts counts;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    const std::int64_t numel = widths[i] * widths[i + 1] + widths[i + 1];
    counts.psi += static_cast<double>(numel);
    counts.padded += static_cast<double>((numel + world_size - 1) / world_size * world_size);
  }
  return counts;
}

// The ZeRO stage a deepspeed cell runs (its name's, or its +stage= option).
char zero_stage(const cell& spec) {
  const std::string& name = spec.strategy;
  const char named = name == "deepspeed" ? '2' : name[std::string_view("deepspeed_stage_").size()];
  return spec.option("stage", std::string(1, named)).front();
}

}  // namespace

double optimizer_state_bytes(std::string_view optimizer) { return optimizer == "sgd" ? 0 : 8; }

std::optional<double> state_formula(const cell& spec, const std::vector<std::int64_t>& widths, int world_size,
                                    std::string_view precision, double optimizer_bytes) {
  const std::string& name = spec.strategy;
  if (precision != "32-true") return std::nullopt;
  const auto [psi, padded] = counts_of(widths, world_size);
  const double n = world_size;
  const double k = optimizer_bytes;  // per parameter
  if (name.rfind("ddp", 0) == 0) return std::nullopt;
  if (spec.is_raw() || name == "single_device" || name == "parallel" || world_size == 1) return (8 + k) * psi;
  if (name == "fsdp" || name == "fsdp_cpu_offload") {
    const std::string sharding = spec.option("sharding_strategy", "FULL_SHARD");
    if (sharding == "NO_SHARD") return (8 + k) * psi;
    if (sharding == "SHARD_GRAD_OP") return 4 * padded + (4 + k) * padded / n;
    if (sharding == "HYBRID_SHARD" && spec.option("device_mesh_replicate", "1") != "1") return std::nullopt;
    return (8 + k) * padded / n;
  }
  if (name.rfind("deepspeed", 0) == 0 && name.find("nvme") == std::string::npos) {
    switch (zero_stage(spec)) {
      case '1': return 8 * padded + k * padded / n;
      case '2': return 4 * padded + (4 + k) * padded / n;
      default: return (8 + k) * padded / n;
    }
  }
  if (name == "model_parallel" && spec.option("data_parallel_size", "1") == "1" && widths.size() % 2 == 1) {
    double local = 0;
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
      const double weight = static_cast<double>(widths[i] * widths[i + 1]) / n;
      const double bias = static_cast<double>(widths[i + 1]);
      local += weight + (i % 2 == 1 ? bias : bias / n);
    }
    return (8 + k) * local;
  }
  return std::nullopt;
}

std::optional<double> payload_formula(const cell& spec, const std::vector<std::int64_t>& widths, int world_size,
                                      std::int64_t batch, std::string_view precision) {
  const std::string& name = spec.strategy;
  if (spec.is_raw() || name == "single_device" || name == "parallel" || world_size == 1) return 0.0;
  if (precision != "32-true") return std::nullopt;
  const std::size_t layers = widths.size() - 1;
  const auto [parameters, padded] = counts_of(widths, world_size);
  const double psi_bytes = 4 * parameters;
  const double p_bytes = 4 * padded;
  if (name.rfind("ddp", 0) == 0) {
    const bool find_unused = spec.option("find_unused_parameters", name == "ddp_find_unused_parameters_true"
                                                                       ? "true" : "false") == "true";
    return psi_bytes + (find_unused ? 4.0 * static_cast<double>(2 * layers) : 0.0);
  }
  if (name == "fsdp" || name == "fsdp_cpu_offload") {
    const std::string sharding = spec.option("sharding_strategy", "FULL_SHARD");
    if (sharding == "NO_SHARD") return psi_bytes;
    if (sharding == "SHARD_GRAD_OP") return 2 * p_bytes;
    if (sharding == "HYBRID_SHARD" && spec.option("device_mesh_replicate", "1") != "1") return std::nullopt;
    return 3 * p_bytes;
  }
  if (name.rfind("deepspeed", 0) == 0) {
    if (name.find("nvme") != std::string::npos) return std::nullopt;
    return zero_stage(spec) == '3' ? 3 * p_bytes : 2 * p_bytes;
  }
  if (name == "model_parallel" && spec.option("data_parallel_size", "1") == "1") {
    double activations = 0;
    for (std::size_t i = 0; i < layers; ++i) {
      if (i % 2 == 1) activations += static_cast<double>(widths[i + 1]);  // row-wise output, forward
      else if (i > 0) activations += static_cast<double>(widths[i]);      // column-wise input gradient, backward
    }
    // An odd last layer is column-wise with its output all-gathered (forward).
    if (layers % 2 == 1) activations += static_cast<double>(widths.back());
    return 4.0 * static_cast<double>(batch) * activations;
  }
  return std::nullopt;
}

bool is_peer(std::string_view label) { return label == "torch_ddp" || label == "torch_zero1"; }

std::vector<std::string> default_cells() {
  std::vector<std::string> cells{std::string(raw_loop)};
  for (const auto& entry : loom::runtime::strategy_names()) {
    // Fork variants run as their base under an external launcher; dp and
    // model_parallel are built from objects (model_parallel is added below).
    if (!entry.built || !entry.runs_on_cpu || !entry.reason.empty()) continue;
    if (entry.name.find("fork") != std::string::npos) continue;
    // NVMe offload needs a directory on a local disk: name it with +nvme_path=DIR.
    if (entry.name.find("nvme") != std::string::npos) continue;
    cells.push_back(entry.name);
    if (entry.name == "fsdp") {
      for (const char* sharding : {"SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"}) {
        cells.push_back("fsdp+sharding_strategy=" + std::string(sharding));
      }
    }
  }
  cells.emplace_back("model_parallel");
  cells.emplace_back("torch_ddp");
  cells.emplace_back("torch_zero1");
  return cells;
}

std::vector<std::string> one_rank_cells() {
  return {std::string(raw_loop),
          "single_device",
          "ddp",
          "fsdp",
          "fsdp+sharding_strategy=SHARD_GRAD_OP",
          "fsdp+sharding_strategy=NO_SHARD",
          "fsdp+sharding_strategy=HYBRID_SHARD+device_mesh_replicate=1+device_mesh_shard=1",
          "deepspeed_stage_1",
          "deepspeed_stage_2",
          "deepspeed_stage_3",
          "model_parallel"};
}

}  // namespace loom_bench
