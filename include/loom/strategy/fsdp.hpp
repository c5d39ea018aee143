// Fully sharded data parallel (Lightning's "fsdp", FSDPStrategy): the
// sharding engine (fsdp_engine.hpp) over the model's units on the world,
// configured by fsdp_options; the rest is every sharded strategy's
// (sharded_parallel.hpp). Runs on Gloo (CPU) and NCCL alike; Lightning refuses FSDP on
// CPU, loom does not (docs/fsdp.md lists the differences).
#pragma once

#include <loom/strategy/fsdp_options.hpp>
#include <loom/strategy/sharded_parallel.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace loom {

struct fsdp : sharded_parallel {
  static constexpr std::string_view name = "fsdp";
  static constexpr bool supports_no_backward_sync = true;

  fsdp() = default;
  explicit fsdp(fsdp_options options)
      : sharded_parallel(options.process),
        options_(std::move(options)) {}

  module_state setup_module(torch::nn::Module& module, bool move_to_device = true) {
    comm::process_group& world = this->group();
    if (move_to_device) detail::move_module(module, this->device_);
    return add_engine(module, world, options_);
  }

  // fabric.init_module(true): units sharded as they are built under FULL_SHARD
  // and HYBRID_SHARD (sharded_parallel::construction_sharding_of).
  std::optional<detail::construction_sharding> construction_sharding() const {
    return construction_sharding_of(options_);
  }

  // Sharded (Lightning's default state_dict_type) or full; loaded by
  // sharded_parallel::load_checkpoint.
  void save_checkpoint(const std::string& path, const state& checkpoint, const state_filter& filter,
                       const checkpoint_metadata& metadata) {
    save_full_or_sharded(options_.state_dict == state_dict_type::full, name, "save with state_dict_type=full", path,
                         checkpoint, filter, metadata);
  }

  const fsdp_options& options() const noexcept { return options_; }
  // What the next fabric.save writes (Lightning's state_dict_type).
  void set_state_dict_type(loom::state_dict_type type) noexcept { options_.state_dict = type; }

 private:
  fsdp_options options_;
};

// Lightning's preset "fsdp_cpu_offload" (cpu_offload=True, FULL_SHARD).
// no_backward_sync is refused at compile time: the skipped reductions would
// keep every unit's unsharded gradient on the device, which is what offload
// is for (torch 1.13 got this combination wrong: pytorch#98494).
struct fsdp_cpu_offload : fsdp {
  static constexpr std::string_view name = "fsdp_cpu_offload";
  static constexpr bool supports_no_backward_sync = false;

  fsdp_cpu_offload() : fsdp(offloaded({})) {}
  explicit fsdp_cpu_offload(fsdp_options options) : fsdp(offloaded(std::move(options))) {}

 private:
  static fsdp_options offloaded(fsdp_options options) {
    options.cpu_offload = true;
    return options;
  }
};

static_assert(Strategy<fsdp>);
static_assert(Strategy<fsdp_cpu_offload>);

}  // namespace loom
