// ZeRO under Lightning's "deepspeed" names (DeepSpeedStrategy), built on the
// FSDP sharding engine rather than on the DeepSpeed library: stage 3 is
// FULL_SHARD, stage 2 SHARD_GRAD_OP (parameters whole, gradients and
// optimizer state sharded), stage 1 SHARD_GRAD_OP with the gradients kept
// whole (only the optimizer state sharded), stage 0 NO_SHARD. Configured by
// Lightning's arguments or a DeepSpeed JSON config (zero_config.hpp), with
// DeepSpeed's engine semantics for gradient_accumulation_steps and
// gradient_clipping. Runs on CPU/Gloo, where Lightning refuses DeepSpeed.
#pragma once

#include <loom/compat.hpp>
#include <loom/strategy/deepspeed_options.hpp>
#include <loom/strategy/fsdp_options.hpp>
#include <loom/strategy/sharded_parallel.hpp>
#include <loom/util/autocast_guard.hpp>
#include <loom/util/function_ref.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

// The resolved configuration (zero_config.hpp) and DeepSpeed's loss scaler
// (zero_loss_scaler.hpp), each in its header; the engine's per-model state,
// the NVMe stream and the step are compiled in src/strategy/.
struct zero_config;
class zero_loss_scaler;
namespace detail {
class nvme_stream;
struct adam_hyper;
struct adam_partition_state;
}  // namespace detail

struct deepspeed : sharded_parallel {
  static constexpr std::string_view name = "deepspeed";
  static constexpr bool supports_no_backward_sync = true;
  // Under 16-mixed the loss is scaled by DeepSpeed's scaler, not a GradScaler.
  static constexpr bool scales_own_loss = true;
  // Lightning's rule: DeepSpeed wraps the module and its one optimizer together.
  static constexpr bool needs_joint_setup = true;

 private:
  // What DeepSpeed's engine keeps per model (one engine each: a GAN sets up
  // two on one Fabric): the micro-step count (the accumulation boundary),
  // the fp32 masters (bf16, fp16), the loss scaler (fp16), the NVMe stream.
  // Defined in src/strategy/zero_model.hpp.
  struct zero_model;

 public:
  deepspeed() : deepspeed(deepspeed_options{}) {}
  explicit deepspeed(deepspeed_options options);
  deepspeed(deepspeed&&) noexcept;
  deepspeed& operator=(deepspeed&&) noexcept;
  ~deepspeed();

  // The configuration is resolved once the world size is known (the batch
  // sizes are checked against it); its notices are printed by rank 0.
  void setup_environment(const strategy_environment& environment);

  // fabric.init_module(true): stage 3 shards each loom::unit<M> as it is
  // built. In DeepSpeed's 16-bit mode (bf16, fp16) setup converts the module:
  // each shard is kept in that dtype from construction on (zero.Init builds
  // the 16-bit parameters too), rounded as the conversion would round it.
  std::optional<detail::construction_sharding> construction_sharding() const;

  // The module with its one optimizer (Lightning's rule): the engine shards
  // the parameters, the optimizer then steps this rank's partition.
  module_state setup_module_and_optimizers(torch::nn::Module& module,
                                           std::span<torch::optim::Optimizer* const> optimizers,
                                           bool move_to_device = true);

  // Under bf16 the module computes in bf16 without the precision's autocast
  // (what DeepSpeed does); otherwise as FSDP.
  template <class Forward>
  auto forward(module_state& engine, torch::nn::Module& module, Forward&& run) {
    if (!sixteen_bit()) {
      return sharded_parallel::forward(engine, module, std::forward<Forward>(run));
    }
    // Off on the device the module computes on (cuda:N on a GPU), as
    // torch.autocast(device_type, enabled=False) does; restored on the way out.
    const auto on = device_.type();
    autocast_guard off(on, compat::autocast_dtype(on), /*enabled=*/false);
    return sharded_parallel::forward(engine, module, std::forward<Forward>(run));
  }

  // DeepSpeed's engine.backward: the loss scaled by 1/gradient_accumulation_steps,
  // gradients reduced on the accumulation boundary only.
  // Under fp16 the loss is multiplied by DeepSpeed's loss scale (not the
  // precision's GradScaler).
  // Several models are set up only where backward needs neither (fp32 or
  // bf16, one micro-batch per step).
  template <class P>
  void backward(P& precision, const at::Tensor& loss) {
    backward_with(loss, [&precision](const at::Tensor& scaled) { precision.backward(scaled); });
  }

  // DeepSpeed's engine.step: counts the micro-batch; on the boundary clips
  // (gradient_clipping) and steps this rank's partition.
  template <class P>
  void optimizer_step(P& precision, torch::optim::Optimizer& optimizer, optimizer_slot slot) {
    step_with(optimizer, [&precision, &optimizer, slot] { precision.optimizer_step(optimizer, slot); });
  }

  // Acts right after the model's boundary step only (between micro-batches
  // its gradients are still accumulating).
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none);

  // Lightning raises here; loom clips (the norm over every partition) unless
  // the config clips already.
  std::optional<double> clip_gradients(module_state& engine, torch::nn::Module& module, const clip_options& options);

  fsdp_no_sync_guard no_backward_sync(module_state& engine, bool enabled = true);

  // ------------------------------------------------------------ checkpoints
  // DeepSpeed's layout (checkpoint/io.hpp): PATH/latest and PATH/checkpoint/
  // with each rank's optimizer partition, and the module whole (rank 0,
  // stages 0-2) or in each rank's slices (stage 3).
  void save_checkpoint(const std::string& path, const state& checkpoint, const state_filter& filter,
                       const checkpoint_metadata& metadata);

  // A ZeRO checkpoint of any stage and world size (or an fsdp sharded one,
  // or a full file); with load_full_weights, one full file's module weights
  // only, as Lightning.
  //
  // bf16/fp16: the fp32 masters come from the save's (a checkpoint without
  // them, such as a 32-true save or a full file, rebuilds them from the
  // loaded weights); the loss scaler and micro-step count are restored. With
  // the optimizer state on NVMe, the loaded state is written to the file.
  state load_checkpoint(const std::string& path, const state& checkpoint, bool strict);

  const zero_config& config() const noexcept { return *config_; }
  const deepspeed_options& arguments() const noexcept { return arguments_; }
  // Micro-batches stepped so far by the model whose optimizer this is
  // (DeepSpeed's micro_steps: each model counts its own).
  std::int64_t micro_steps(const torch::optim::Optimizer& optimizer) const;
  // ... of the first model set up (0 before any).
  std::int64_t micro_steps() const noexcept;
  // DeepSpeed's loss scaler (fp16, which takes one model).
  const zero_loss_scaler& loss_scaler() const noexcept;
  // The NVMe optimizer stream (offload_optimizer.device "nvme"), or nullptr.
  const detail::nvme_stream* nvme() const noexcept;
  // Bytes of the fp32 master partitions of every model (bf16 mode).
  std::int64_t master_bytes() const noexcept;
  std::vector<at::Tensor> master_tensors() const;
  // Each floating parameter of the optimizers with its fp32 master partition
  // (from memory, or read from the NVMe file).
  std::vector<std::pair<at::Tensor, at::Tensor>> master_partitions() const;

 private:
  // The floating parameters and buffers in dtype (integer buffers kept).
  static void to_floating(torch::nn::Module& module, c10::ScalarType dtype);
  void start_nvme(zero_model& model, detail::fsdp_engine& engine);
  static detail::adam_hyper hyper_of(torch::optim::Optimizer& optimizer);
  // The checkpoint's entries DeepSpeed's engine adds to the user's state.
  static constexpr std::string_view masters_key = "zero_fp32_masters";
  static constexpr std::string_view scaler_key = "zero_loss_scaler";
  static constexpr std::string_view micro_steps_key = "zero_micro_steps";

  // The segment (NVMe stream partition) holding a parameter's slice, and the
  // slice's offset in it.
  static std::pair<std::size_t, std::int64_t> nvme_place(const zero_model& model, const at::Tensor& parameter);
  // The optimizer's (in-memory) Adam state gathered into the stream's layout.
  static detail::adam_partition_state nvme_state_from(const zero_model& model);
  // For a save: the state file read back into the optimizer as Adam's (or
  // AdamW's) per-parameter state, and dropped again when the save is done.
  struct nvme_state_in_optimizer;

  state load_state(const std::string& path, const state& checkpoint, bool strict);

  // The step's body, compiled once (deepspeed_step.cpp): the precision's own
  // backward and optimizer step come in as calls (one indirect call each, no
  // allocation), so a Fabric's instantiation is only the forwarding above.
  void backward_with(const at::Tensor& loss, function_ref<void(const at::Tensor&)> precision_backward);
  void step_with(torch::optim::Optimizer& optimizer, function_ref<void()> precision_step);
  // bf16: the optimizer steps the fp32 masters with the gradients in fp32
  // (reduced in fp32 already), clipped there; the result is cast back into
  // the bf16 partition.
  void step_masters(zero_model& model, function_ref<void()> precision_step);
  // The norm over every rank's fp32 gradient partitions.
  void clip_masters(zero_model& model, double max_norm);
  // The config's gradient_clipping (DeepSpeed's: the 2-norm) over every
  // rank's gradient partitions; 1 when nothing is clipped.
  double clip_coefficient(const std::vector<at::Tensor>& gradients, double max_norm);

 protected:
  // Lightning's presets: the arguments they fix over the user's.
  static deepspeed_options preset(deepspeed_options options, int stage, bool offload_optimizer,
                                  bool offload_parameters, bool nvme);

 private:
  // The sharding engine's options for a stage.
  fsdp_options engine_options(const zero_config& config) const;
  // The model an optimizer was set up with (one optimizer per model).
  zero_model& model_of(const torch::optim::Optimizer& optimizer) const;
  // The model with an NVMe stream (which takes one model per Fabric), or nullptr.
  zero_model* nvme_owner() const noexcept;
  bool any_masters() const noexcept;
  // DeepSpeed's 16-bit mode (the config's bf16 or fp16): the module in that
  // dtype, computed without autocast, stepped through fp32 masters.
  bool sixteen_bit() const noexcept;

  deepspeed_options arguments_;
  std::unique_ptr<zero_config> config_;  // resolved at setup_environment
  fsdp_options engine_options_;  // what the config's stage asks of the sharding engine
  std::vector<std::unique_ptr<zero_model>> models_;  // in setup order
};

// Lightning's registered presets (DeepSpeedStrategy.register_strategies).
// The offload presets refuse no_backward_sync at compile time, as
// fsdp_cpu_offload does (deepspeed with offload options, at run time).
#define LOOM_DEEPSPEED_PRESET(type, stage, offload_optimizer, offload_parameters, nvme)                      \
  struct type : deepspeed {                                                                                 \
    static constexpr std::string_view name = #type;                                                         \
    static constexpr bool supports_no_backward_sync = !(offload_optimizer || offload_parameters);           \
    type() : type(deepspeed_options{}) {}                                                                   \
    explicit type(deepspeed_options options)                                                                \
        : deepspeed(preset(std::move(options), stage, offload_optimizer, offload_parameters, nvme)) {}      \
  };                                                                                                        \
  static_assert(Strategy<type>)
LOOM_DEEPSPEED_PRESET(deepspeed_stage_1, 1, false, false, false);
LOOM_DEEPSPEED_PRESET(deepspeed_stage_1_offload, 1, true, false, false);
LOOM_DEEPSPEED_PRESET(deepspeed_stage_2, 2, false, false, false);
LOOM_DEEPSPEED_PRESET(deepspeed_stage_2_offload, 2, true, false, false);
LOOM_DEEPSPEED_PRESET(deepspeed_stage_3, 3, false, false, false);
LOOM_DEEPSPEED_PRESET(deepspeed_stage_3_offload, 3, true, true, false);
LOOM_DEEPSPEED_PRESET(deepspeed_stage_3_offload_nvme, 3, true, true, true);
#undef LOOM_DEEPSPEED_PRESET

static_assert(Strategy<deepspeed>);

}  // namespace loom
