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

bool is_peer(std::string_view label) { return label == "torch_ddp" || label == "torch_zero1"; }

std::vector<std::string> default_cells() {
  std::vector<std::string> cells{std::string(raw_loop)};
  for (const auto& entry : loom::runtime::strategy_names()) {
    // Fork variants run as their base under an external launcher; dp and
    // model_parallel are built from objects (model_parallel is added below).
    if (!entry.built || !entry.devices.contains(loom::rules::device_type::cpu) || !entry.reason.empty()) continue;
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
