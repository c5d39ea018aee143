// The sharding engine behind loom::fsdp (and ZeRO after it): the parameters
// of each unit in one flat buffer padded to a multiple of the shard count,
// this rank keeping its shard; all-gathered before the unit's forward and
// again before its backward (prefetched one unit ahead), freed after;
// gradients reduce-scattered (averaged) as soon as the unit's backward is
// done. The user's parameters are re-pointed (Tensor::set_data) to their
// slices of the shard, so any torch::optim optimizer steps on shards.
// Compiled once in src/; the model reaches it through loom::unit<M>.
#pragma once

#include <loom/checkpoint/io.hpp>
#include <loom/comm/process_group.hpp>
#include <loom/concepts/precision_dtypes.hpp>
#include <loom/strategy/fsdp_engine_calls.hpp>
#include <loom/strategy/fsdp_options.hpp>
#include <loom/strategy/placement.hpp>
#include <loom/util/clip_options.hpp>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace loom::detail {

// What one unit holds, for tests, benchmarks and the docs' tables.
struct unit_summary {
  std::string name;        // the module's dotted path ("" for the root)
  std::int64_t numel = 0;  // parameters flattened into it
  std::int64_t padded = 0; // numel rounded up to a multiple of the shard count
  std::int64_t shard = 0;  // elements this rank keeps
  bool checkpoint = false;  // its forward is recomputed in backward (activation checkpointing)
};

// Where parameter shards live between uses when they are not kept in
// memory (ZeRO-Infinity's offload_param to NVMe): partition k is the k-th
// unit with parameters, as partitions() lists them.
class shard_store {
 public:
  virtual ~shard_store() = default;
  // Fills shard (this rank's flat partition k) from the store.
  virtual void load_shard(std::size_t partition, const at::Tensor& shard) = 0;
  // Writes shard (after a checkpoint load changed it).
  virtual void store_shard(std::size_t partition, const at::Tensor& shard) = 0;
};

class fsdp_engine {
 public:
  // Collective over world: every rank builds the same units. shard_size is
  // the size of the shard group (the replicate group is world / shard_size).
  // precision: the Fabric's (bf16-mixed reduces gradients in bf16 unless
  // options.mixed_precision says otherwise).
  fsdp_engine(torch::nn::Module& module, comm::process_group& world, const fsdp_options& options,
              int ranks_per_node, const precision_dtypes& precision = {});
  fsdp_engine(const fsdp_engine&) = delete;
  fsdp_engine& operator=(const fsdp_engine&) = delete;
  ~fsdp_engine();

  // Around the wrapped module's forward: the root unit (parameters outside
  // every sub-unit) is gathered for the whole forward and its backward.
  void root_pre_forward();
  void root_watch_output(const at::Tensor& output);
  void root_post_forward();

  bool sync_enabled() const noexcept;
  void set_sync_enabled(bool enabled) noexcept;

  // The norm over every shard (the single-device norm), and the clipping.
  std::optional<double> clip_gradients(const clip_options& options);
  // Sets every gradient to none (the reduced shard is written, not added).
  void zero_grad();

  // Full parameters, gathered unit by unit: visit(name, full tensor) on
  // `root` only (every rank takes part). -1: on every rank.
  void gather_full_parameters(int root, const std::function<void(const std::string&, const at::Tensor&)>& visit);
  // One placement record per parameter (placement.hpp): its flat slice of
  // the unit's buffer over the shard group, what the full-state scope, the
  // save layout and the checkpoints read.
  std::vector<placement> placements() const;
  // The module the engine was set up on (its root unit).
  const torch::nn::Module& module() const;
  // The end of a full-state scope (full_state.hpp): the parameters point at
  // their shards, and a shard store writes them when changed.
  void after_full_state(bool changed);
  // Whether an optimizer's per-parameter state can be sliced and gathered
  // (SGD, Adam, AdamW, RMSprop, Adagrad).
  static bool knows_state_layout(torch::optim::Optimizer& optimizer);

  std::vector<unit_summary> units() const;
  // Each unit's flat parameter partition on this rank and its gradient
  // partition (1-D, padding included), for ZeRO's NVMe optimizer stream.
  std::vector<std::pair<at::Tensor, at::Tensor>> partitions() const;
  // From now on the parameter shards live in store (FULL_SHARD only): they
  // are freed here, read back for each gather and freed when it completes;
  // the store owns their values (its optimizer step updates them there).
  // The store must hold the current shards already, and outlive the engine's use.
  void set_shard_store(shard_store* store);
  // Brackets code that reads (or, with changed, writes) the parameter
  // shards directly, such as a sharded save: they stay in memory meanwhile.
  // No-ops without a shard store.
  void pin_shards();
  void unpin_shards(bool changed);
  const fsdp_counters& counters() const noexcept;
  int shard_size() const noexcept;
  int replicate_size() const noexcept;
  bool cpu_offload() const noexcept;  // the shards live on the CPU between uses
  // Bytes of the flat shards this rank keeps (parameters), and of everything
  // the engine holds between steps (shards, gradient shards, caches).
  std::int64_t parameter_shard_bytes() const;
  std::int64_t held_bytes() const;
  // The engine's own buffers (shards, gradient shards, gathered buffers, a
  // reduction in flight), for counting storages once (bench/fsdp_memory).
  std::vector<at::Tensor> held_tensors() const;

  struct impl;

 private:
  // Shared so that autograd's hooks can hold it weakly (a loss may outlive it).
  std::shared_ptr<impl> impl_;
};

// The slices of the split parameters (by state-dict name) a sharded save of
// checkpoint writes, read off their placements (the engines' slices, tensor
// parallel's chunks); a configuration_error, naming `strategy`, for an
// optimizer whose state loom cannot slice, and for two modules (a GAN's) with
// a parameter of the same name, whose slices would write over each other.
// `names`, when given, receives each parameter's (TensorImpl's) name.
shard_layout sharded_save_layout(const state& checkpoint, const std::vector<std::weak_ptr<fsdp_engine>>& engines,
                                 std::string_view strategy, std::map<const void*, std::string>* names = nullptr);

// Why no_backward_sync is refused with offloading (fsdp_cpu_offload and the
// deepspeed offload presets at compile time; the options at run time).
inline constexpr const char* offload_refusal_reason =
    "skipped reductions would keep every unit's unsharded gradient on the device, which offloading is there to "
    "free. Accumulate without it (each micro-batch's backward then reduces), or turn offloading off.";

}  // namespace loom::detail
