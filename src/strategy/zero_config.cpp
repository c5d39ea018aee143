// DeepSpeed's configuration, resolved as Lightning does (a user config
// replaces the arguments; without one the arguments are mapped to JSON as
// _create_default_config and _format_precision_config map them) and checked
// key by key against loom's table. The table is the code below: each key is
// read with its type and range, or noted (accepted, no effect in loom), or
// refused; whatever is left unread is an unknown key.
#include <loom/environment.hpp>
#include <loom/errors.hpp>
#include <loom/strategy/zero_config.hpp>

#include "../util/outside_files.hpp"
#include "../util/outside_json.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

namespace loom {

namespace {

using json = nlohmann::json;

std::string shown(const json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// Reads one JSON object, remembering which keys were asked for.
class section {
 public:
  section(const json& object, std::string path, std::string source, zero_config& config)
      : object_(object), path_(std::move(path)), source_(std::move(source)), config_(config) {
    if (!object_.is_object()) fail(path_.empty() ? "the config" : path_, object_, "a JSON object");
  }

  bool has(std::string_view key) const { return object_.contains(std::string(key)); }

  void boolean(std::string_view key, bool& out) {
    if (const json* value = find(key)) {
      if (!value->is_boolean()) fail(name(key), *value, "true or false");
      out = value->get<bool>();
    }
  }
  void integer(std::string_view key, std::int64_t& out, std::int64_t at_least,
               std::int64_t at_most = std::numeric_limits<std::int64_t>::max()) {
    if (const json* value = find(key)) {
      // DeepSpeed's own configs write sizes as 5e8: a float with an integral value is an integer.
      std::int64_t v = 0;
      if (value->is_number_integer()) {
        v = value->get<std::int64_t>();
      } else if (value->is_number_float() && std::floor(value->get<double>()) == value->get<double>() &&
                 std::abs(value->get<double>()) < 9.2e18) {
        v = static_cast<std::int64_t>(value->get<double>());
      } else {
        fail(name(key), *value, "an integer from " + std::to_string(at_least) + range_end(at_most));
      }
      if (v < at_least || v > at_most) {
        fail(name(key), *value, "an integer from " + std::to_string(at_least) + range_end(at_most));
      }
      out = v;
    }
  }
  void number(std::string_view key, double& out, double at_least) {
    if (const json* value = find(key)) {
      if (!value->is_number() || value->get<double>() < at_least) {
        fail(name(key), *value, "a number >= " + trimmed(at_least));
      }
      out = value->get<double>();
    }
  }
  void text(std::string_view key, std::string& out, std::initializer_list<std::string_view> accepted) {
    if (const json* value = find(key)) {
      std::string list;
      for (auto a : accepted) list += (list.empty() ? "" : ", ") + std::string("\"") + std::string(a) + "\"";
      if (!value->is_string()) fail(name(key), *value, "one of " + list);
      const std::string v = value->get<std::string>();
      bool ok = false;
      for (auto a : accepted) ok = ok || a == v;
      if (!ok) fail(name(key), *value, "one of " + list);
      out = v;
    }
  }
  void path_text(std::string_view key, std::string& out) {
    if (const json* value = find(key)) {
      if (!value->is_string() || value->get<std::string>().empty()) fail(name(key), *value, "a directory path");
      out = value->get<std::string>();
    }
  }
  // A sub-object, read by body (absent: body is not called).
  void object(std::string_view key, const std::function<void(section&)>& body) {
    if (const json* value = find(key)) {
      section inner(*value, name(key), source_, config_);
      body(inner);
      inner.finish();
    }
  }
  // Accepted, without effect in loom: a notice when the value is not the default.
  void noted(std::string_view key, const json& default_value, const std::string& why) {
    if (const json* value = find(key)) {
      if (*value != default_value) config_.notices.push_back("'" + name(key) + "' = " + shown(*value) + " is ignored: " + why);
    }
  }
  // Accepted, without effect in loom, whatever the value.
  void ignored(std::string_view key, const std::string& why) {
    if (const json* value = find(key)) config_.notices.push_back("'" + name(key) + "' = " + shown(*value) + " is ignored: " + why);
  }
  void refused(std::string_view key, const std::string& why) {
    if (const json* value = find(key)) {
      throw configuration_error("deepspeed config (" + source_ + "): '" + name(key) + "' = " + shown(*value) +
                                " is refused: " + why);
    }
  }

  void finish() const {
    for (const auto& item : object_.items()) {
      if (asked_.count(item.key()) > 0) continue;
      std::string list;
      for (const auto& key : asked_) list += (list.empty() ? "" : ", ") + key;
      throw configuration_error("deepspeed config (" + source_ + "): unknown key '" + name(item.key()) +
                                "'; loom accepts" + (path_.empty() ? "" : " in '" + path_ + "'") + ": " + list +
                                " (docs/deepspeed.md lists each with its behaviour)");
    }
  }

  [[noreturn]] void fail(const std::string& key, const json& value, const std::string& accepted) const {
    if (value.is_string() && value.get<std::string>() == "auto") {
      throw configuration_error("deepspeed config (" + source_ + "): '" + key +
                                "' = \"auto\": \"auto\" is a Hugging Face Trainer convention that DeepSpeed itself "
                                "rejects; write the value (" + accepted + ")");
    }
    throw configuration_error("deepspeed config (" + source_ + "): '" + key + "' = " + shown(value) + " is not " +
                              accepted);
  }

  std::string name(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

 private:
  const json* find(std::string_view key) {
    asked_.insert(std::string(key));
    auto found = object_.find(std::string(key));
    return found == object_.end() ? nullptr : &*found;
  }
  static std::string trimmed(double v) {
    std::ostringstream out;
    out << v;
    return out.str();
  }
  static std::string range_end(std::int64_t at_most) {
    return at_most == std::numeric_limits<std::int64_t>::max() ? " up" : " to " + std::to_string(at_most);
  }

  const json& object_;
  std::string path_;
  std::string source_;
  zero_config& config_;
  std::set<std::string> asked_;
};

offload_device device_of(const std::string& text) {
  if (text == "cpu") return offload_device::cpu;
  if (text == "nvme") return offload_device::nvme;
  return offload_device::none;
}

// Lightning's _create_default_config: the arguments as DeepSpeed JSON.
json from_arguments(const deepspeed_options& o) {
  json config = json::object();
  config["activation_checkpointing"] = {{"partition_activations", o.partition_activations},
                                        {"cpu_checkpointing", o.cpu_checkpointing},
                                        {"contiguous_memory_optimization", o.contiguous_memory_optimization},
                                        {"synchronize_checkpoint_boundary", o.synchronize_checkpoint_boundary}};
  config["aio"] = {{"block_size", o.block_size},
                   {"queue_depth", o.queue_depth},
                   {"single_submit", o.single_submit},
                   {"overlap_events", o.overlap_events},
                   {"thread_count", o.thread_count}};
  if (o.zero_optimization) {
    json zero = {{"stage", o.stage},
                 {"contiguous_gradients", o.contiguous_gradients},
                 {"overlap_comm", o.overlap_comm},
                 {"allgather_partitions", o.allgather_partitions},
                 {"reduce_scatter", o.reduce_scatter},
                 {"allgather_bucket_size", o.allgather_bucket_size},
                 {"reduce_bucket_size", o.reduce_bucket_size},
                 {"sub_group_size", o.sub_group_size}};
    if (o.offload_optimizer) {
      zero["offload_optimizer"] = {{"device", o.offload_optimizer_device},
                                   {"nvme_path", o.nvme_path},
                                   {"buffer_count", o.optimizer_buffer_count},
                                   {"pin_memory", o.pin_memory}};
    }
    if (o.offload_parameters) {
      zero["offload_param"] = {{"device", o.offload_params_device}, {"nvme_path", o.nvme_path},
                               {"buffer_count", o.params_buffer_count}, {"buffer_size", o.params_buffer_size},
                               {"max_in_cpu", o.max_in_cpu},         {"pin_memory", o.pin_memory}};
    }
    config["zero_optimization"] = std::move(zero);
  }
  config["zero_allow_untested_optimizer"] = o.zero_allow_untested_optimizer;
  if (o.logging_batch_size_per_gpu && *o.logging_batch_size_per_gpu > 0) {
    config["train_micro_batch_size_per_gpu"] = *o.logging_batch_size_per_gpu;
  }
  return config;
}

json parse_text(const std::string& text, const std::string& source) {
  return loom::detail::parse_outside_json(text, "deepspeed config (" + source + ")");
}

[[noreturn]] void refuse_config(const std::string& path, const std::string& why) {
  throw configuration_error("deepspeed config " + path + ": it " + why);
}

// A DeepSpeed config is a small JSON file: larger than this, it is not one.
constexpr std::size_t config_byte_limit = std::size_t{16} << 20;

json read_file(const std::string& path, const std::string& source) {
  const auto bytes = loom::detail::read_regular_file(path, config_byte_limit, &refuse_config);
  if (!bytes) {
    throw configuration_error("deepspeed: you passed in a path to a DeepSpeed config but the path does not exist: " +
                              path + " (" + source + ")");
  }
  return parse_text(std::string(bytes->begin(), bytes->end()), source);
}

void read_offload(section& zero, std::string_view key, zero_offload& out, bool has_buffer_size, int stage) {
  zero.object(key, [&](section& s) {
    std::string device = "none";
    s.text("device", device, {"none", "cpu", "nvme"});
    out.device = device_of(device);
    s.path_text("nvme_path", out.nvme_path);
    s.integer("buffer_count", out.buffer_count, 1, 1 << 16);
    if (has_buffer_size) {
      s.integer("buffer_size", out.buffer_size, 1);
      s.integer("max_in_cpu", out.max_in_cpu, 0);
    }
    s.boolean("pin_memory", out.pin_memory);
    s.noted("fast_init", false, "loom initialises the offloaded state as it first steps");
    s.noted("ratio", 1.0, "the whole optimizer step is offloaded");
    if (out.device == offload_device::nvme && out.nvme_path.empty()) {
      throw configuration_error("deepspeed config: '" + s.name("nvme_path") +
                                "' is missing: offloading to nvme needs the directory to stream through");
    }
  });
  // As DeepSpeed: "NVMe offloading is available only with ZeRO stage 3",
  // and parameters are offloaded by stage 3 only.
  const std::string name = "zero_optimization." + std::string(key);
  if (key == "offload_param" && out.device != offload_device::none && stage < 3) {
    throw configuration_error("deepspeed config: '" + name + ".device' = \"" +
                              (out.device == offload_device::cpu ? "cpu" : "nvme") +
                              "\" needs ZeRO stage 3 (zero_optimization.stage is " + std::to_string(stage) +
                              "): parameters are partitioned, and so offloaded, by stage 3 only");
  }
  if (out.device == offload_device::nvme && stage < 3) {
    throw configuration_error("deepspeed config: '" + name + ".device' = \"nvme\" needs ZeRO stage 3 "
                              "(zero_optimization.stage is " + std::to_string(stage) +
                              "): as DeepSpeed says, NVMe offloading is available only with ZeRO stage 3");
  }
}

// zero_optimization: the stage, its offloads and its buckets.
int read_zero_optimization(section& top, zero_config& config) {
  int stage = 0;
  if (top.has("zero_optimization")) {
    top.object("zero_optimization", [&](section& zero) {
      std::int64_t s = 0;
      if (zero.has("stage")) {
        zero.integer("stage", s, 0, std::numeric_limits<std::int64_t>::max());
        if (s > 3) {
          throw configuration_error("deepspeed config (" + config.source + "): 'zero_optimization.stage' = " +
                                    std::to_string(s) + " is not a ZeRO stage: 0, 1, 2 or 3 are accepted");
        }
      }
      stage = static_cast<int>(s);
      read_offload(zero, "offload_optimizer", config.offload_optimizer, false, stage);
      read_offload(zero, "offload_param", config.offload_param, true, stage);
      zero.boolean("contiguous_gradients", config.contiguous_gradients);
      zero.boolean("overlap_comm", config.overlap_comm);
      zero.boolean("allgather_partitions", config.allgather_partitions);
      zero.boolean("reduce_scatter", config.reduce_scatter);
      zero.integer("allgather_bucket_size", config.allgather_bucket_size, 1);
      zero.integer("reduce_bucket_size", config.reduce_bucket_size, 1);
      zero.integer("sub_group_size", config.sub_group_size, 1);
      const std::string stage3 = "loom's stage 3 gathers one unit (loom::unit<M>, or a reduce_bucket_size of "
                                 "parameters) at a time and prefetches the next; ";
      zero.ignored("stage3_prefetch_bucket_size", stage3 + "the prefetch is one unit");
      zero.ignored("stage3_param_persistence_threshold", stage3 + "every parameter is partitioned");
      zero.ignored("stage3_max_live_parameters", stage3 + "at most two units are live");
      zero.ignored("stage3_max_reuse_distance", stage3 + "a unit is freed after each use");
      zero.ignored("stage3_gather_16bit_weights_on_model_save",
                   "fabric.save writes loom's checkpoint layout; loom-run consolidate writes the full weights");
      zero.ignored("stage3_gather_fp16_weights_on_model_save",
                   "fabric.save writes loom's checkpoint layout; loom-run consolidate writes the full weights");
      zero.noted("round_robin_gradients", false, "loom's gradient partitions are contiguous chunks of each unit");
      zero.noted("load_from_fp32_weights", true, "loom's checkpoints hold the fp32 weights, which it loads");
      zero.noted("elastic_checkpoint", false, "loom's checkpoints reshard to any world size anyway");
      zero.refused("cpu_offload", "DeepSpeed replaced it with offload_optimizer: {\"device\": \"cpu\"}");
    });
  }
  return stage;
}

// The sections beside zero_optimization: aio (the NVMe stream), activation
// checkpointing (noted), fp16 and bf16.
void read_other_sections(section& top, zero_config& config) {
  top.object("aio", [&](section& aio) {
    aio.integer("block_size", config.aio.block_size, 512);
    aio.integer("queue_depth", config.aio.queue_depth, 1, 1 << 16);
    aio.boolean("single_submit", config.aio.single_submit);
    aio.boolean("overlap_events", config.aio.overlap_events);
    aio.integer("thread_count", config.aio.thread_count, 1, 1024);
  });
  top.object("activation_checkpointing", [&](section& ac) {
    const std::string why = "it configures deepspeed.checkpointing.checkpoint, which loom does not have; "
                            "declare the block as loom::unit<M> with activation checkpointing instead";
    ac.noted("partition_activations", false, why);
    ac.noted("cpu_checkpointing", false, why);
    ac.noted("contiguous_memory_optimization", false, why);
    ac.noted("synchronize_checkpoint_boundary", false, why);
    ac.noted("number_checkpoints", nullptr, why);
    ac.noted("profile", false, why);
  });
  top.object("fp16", [&](section& fp16) {
    fp16.boolean("enabled", config.fp16.enabled);
    fp16.number("loss_scale", config.fp16.loss_scale, 0);
    fp16.integer("initial_scale_power", config.fp16.initial_scale_power, 0, 64);
    fp16.integer("loss_scale_window", config.fp16.loss_scale_window, 1);
    fp16.integer("hysteresis", config.fp16.hysteresis, 1);
    fp16.number("min_loss_scale", config.fp16.min_loss_scale, 0);
  });
  top.object("bf16", [&](section& bf16) { bf16.boolean("enabled", config.bf16); });
}

// The precision: the Fabric's decides (Lightning adds the section from it
// when the config has none); a config that says otherwise is an error.
void check_precision(const json& root, zero_config& config, const precision_dtypes& precision) {
  const bool half = precision.half();
  const bool brain = precision.bfloat();
  if (!root.contains("fp16") && half) config.fp16.enabled = true;
  if (!root.contains("bf16") && brain) config.bf16 = true;
  if (config.fp16.enabled && !half) {
    throw configuration_error("deepspeed config (" + config.source + "): 'fp16.enabled' is true but the Fabric's "
                              "precision is " + std::string(precision.name) +
                              ": choose precision 16-mixed, or drop fp16");
  }
  if (config.bf16 && !brain) {
    throw configuration_error("deepspeed config (" + config.source + "): 'bf16.enabled' is true but the Fabric's "
                              "precision is " + std::string(precision.name) +
                              ": choose bf16-mixed or bf16-true, or drop "
                              "bf16");
  }
  if (config.fp16.enabled && config.bf16) {
    throw configuration_error("deepspeed config (" + config.source + "): 'fp16.enabled' and 'bf16.enabled' are both "
                              "true; DeepSpeed takes one");
  }
}

// Batch sizes as DeepSpeed derives and checks them; a product of values
// from outside is checked before it is used.
void derive_batch_sizes(zero_config& config, std::int64_t batch, std::int64_t micro, std::int64_t accumulation,
                        int world_size) {
  const std::int64_t w = world_size;
  auto product = [&](std::int64_t a, std::int64_t b, std::int64_t c, const char* names) {
    std::int64_t out = 0;
    if (__builtin_mul_overflow(a, b, &out) || __builtin_mul_overflow(out, c, &out)) {
      throw configuration_error("deepspeed config (" + config.source + "): " + names + " = " + std::to_string(a) +
                                " x " + std::to_string(b) + " x " + std::to_string(c) +
                                " does not fit in a 64-bit integer (no batch is that large)");
    }
    return out;
  };
  const char* all_three = "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size";
  if (batch > 0 && micro > 0 && accumulation > 0) {
    if (batch != product(micro, accumulation, w, all_three)) {
      throw configuration_error(
          "deepspeed config (" + config.source + "): train_batch_size = " + std::to_string(batch) +
          " must equal train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size = " +
          std::to_string(micro) + " x " + std::to_string(accumulation) + " x " + std::to_string(w) + " = " +
          std::to_string(product(micro, accumulation, w, all_three)));
    }
  } else if (batch > 0 && micro > 0) {
    const std::int64_t per_step = product(micro, 1, w, "train_micro_batch_size_per_gpu x world size");
    if (batch % per_step != 0) {
      throw configuration_error("deepspeed config (" + config.source + "): train_batch_size = " +
                                std::to_string(batch) + " is not a multiple of train_micro_batch_size_per_gpu x "
                                "world size = " + std::to_string(per_step));
    }
    accumulation = batch / per_step;
  } else if (batch > 0) {
    if (accumulation == 0) accumulation = 1;
    const std::int64_t per_micro = product(accumulation, 1, w, "gradient_accumulation_steps x world size");
    if (batch % per_micro != 0) {
      throw configuration_error("deepspeed config (" + config.source + "): train_batch_size = " +
                                std::to_string(batch) + " is not a multiple of gradient_accumulation_steps x world "
                                "size = " + std::to_string(per_micro));
    }
    micro = batch / per_micro;
  } else {
    if (micro == 0) micro = 1;  // Lightning: setdefault("train_micro_batch_size_per_gpu", 1)
    if (accumulation == 0) accumulation = 1;
    batch = product(micro, accumulation, w, all_three);
  }
  config.train_batch_size = batch;
  config.train_micro_batch_size_per_gpu = micro;
  config.gradient_accumulation_steps = accumulation;
}

void read_config(const json& root, zero_config& config, const precision_dtypes& precision, int world_size) {
  section top(root, "", config.source, config);
  // Batch sizes and the step.
  std::int64_t batch = 0, micro = 0, accumulation = 0;
  top.integer("train_batch_size", batch, 1);
  top.integer("train_micro_batch_size_per_gpu", micro, 1);
  top.integer("gradient_accumulation_steps", accumulation, 1);
  top.number("gradient_clipping", config.gradient_clipping, 0);
  top.boolean("zero_allow_untested_optimizer", config.zero_allow_untested_optimizer);
  top.ignored("steps_per_print", "loom does not print progress; log with fabric.log");
  top.ignored("wall_clock_breakdown", "loom does not time its phases; see bench/ and fabric's throughput monitor");
  top.ignored("dump_state", "loom prints no engine state");
  top.refused("optimizer", "pass a torch::optim optimizer to fabric.setup(module, optimizer) instead (loom builds no "
                           "optimizer from JSON; its ZeRO steps any torch::optim optimizer on the shards)");
  top.refused("scheduler", "step a LibTorch scheduler (or loom's trainer schedules) yourself; loom builds no "
                           "scheduler from JSON");
  std::string communication;
  top.text("communication_data_type", communication, {"fp32", "fp16", "bf16"});
  config.communication_data_type = communication;
  top.noted("prescale_gradients", false,
            "loom sums the gradients and divides once by the world size; dividing first gives the same mean");
  top.noted("gradient_predivide_factor", 1.0,
            "loom sums the gradients and divides once by the world size; dividing first gives the same mean");

  config.stage = read_zero_optimization(top, config);
  read_other_sections(top, config);
  top.finish();
  check_precision(root, config, precision);
  derive_batch_sizes(config, batch, micro, accumulation, world_size);
}

}  // namespace

zero_config resolve_zero_config(const deepspeed_options& options, const precision_dtypes& precision, int world_size) {
  zero_config config;
  json root;
  if (!options.config.empty()) {
    const bool text = options.config.find_first_not_of(" \t\r\n") != std::string::npos &&
                      options.config[options.config.find_first_not_of(" \t\r\n")] == '{';
    config.source = text ? "a config object" : "config file " + options.config;
    root = text ? parse_text(options.config, config.source) : read_file(options.config, config.source);
  } else if (const auto path = cluster::setting_text("PL_DEEPSPEED_CONFIG_PATH")) {
    config.source = "PL_DEEPSPEED_CONFIG_PATH=" + *path;
    root = read_file(*path, config.source);
  } else {
    config.source = "the strategy's arguments";
    root = from_arguments(options);
    // Lightning's _format_precision_config adds fp16 from the arguments.
    if (precision.half()) {
      root["fp16"] = {{"enabled", true},
                      {"loss_scale", options.loss_scale},
                      {"initial_scale_power", options.initial_scale_power},
                      {"loss_scale_window", options.loss_scale_window},
                      {"hysteresis", options.hysteresis},
                      {"min_loss_scale", options.min_loss_scale}};
    }
  }
  read_config(root, config, precision, world_size);
  // Arguments that never reach the JSON.
  config.load_full_weights = options.load_full_weights;
  config.exclude_frozen_parameters = options.exclude_frozen_parameters;
  if (options.remote_device && !options.remote_device->empty()) {
    config.notices.push_back("remote_device = \"" + *options.remote_device + "\" is ignored: loom creates parameters "
                             "where init_module puts them and partitions them at setup (offload_param places them "
                             "after that)");
  }
  if (options.logging_level != "WARN") {
    config.notices.push_back("logging_level = " + options.logging_level + " is ignored: loom's engine logs nothing");
  }
  return config;
}

}  // namespace loom
