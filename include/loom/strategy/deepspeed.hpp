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
#include <loom/errors.hpp>
#include <loom/strategy/deepspeed_options.hpp>
#include <loom/strategy/fsdp_options.hpp>
#include <loom/strategy/gradient_norm.hpp>
#include <loom/strategy/nvme_stream.hpp>
#include <loom/strategy/sharded_parallel.hpp>
#include <loom/strategy/zero_config.hpp>
#include <loom/strategy/zero_loss_scaler.hpp>
#include <loom/util/autocast_guard.hpp>

#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

struct deepspeed : sharded_parallel {
  static constexpr std::string_view name = "deepspeed";
  static constexpr bool supports_no_backward_sync = true;
  // Under 16-mixed the loss is scaled by DeepSpeed's scaler, not a GradScaler.
  static constexpr bool scales_own_loss = true;
  // Lightning's rule: DeepSpeed wraps the module and its one optimizer together.
  static constexpr bool needs_joint_setup = true;

 private:
  // bf16: a parameter (its data the bf16 partition between steps) and its
  // fp32 master; low and low_grad hold the bf16 tensors during a step.
  struct master_slot {
    at::Tensor param, master, low, low_grad;
  };
  // What DeepSpeed's engine keeps per model (one engine each: a GAN sets up
  // two on one Fabric): the micro-step count (the accumulation boundary),
  // the fp32 masters (bf16, fp16), the loss scaler (fp16), the NVMe stream.
  struct zero_model {
    const torch::nn::Module* module = nullptr;
    torch::optim::Optimizer* optimizer = nullptr;
    std::weak_ptr<detail::fsdp_engine> engine;
    std::int64_t micro_steps = 0;
    std::vector<master_slot> masters;
    zero_loss_scaler scaler;
    std::unique_ptr<detail::nvme_stream> nvme;
    std::vector<at::Tensor> nvme_segments;  // the stream's partitions, in order
  };

 public:

  deepspeed() : deepspeed(deepspeed_options{}) {}
  explicit deepspeed(deepspeed_options options)
      : sharded_parallel(options.process),
        arguments_(std::move(options)) {}

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
    if (!config_.bf16 && !config_.fp16.enabled) {
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
    const std::int64_t k = config_.gradient_accumulation_steps;
    if ((k == 1 && !config_.fp16.enabled) || models_.empty()) {
      precision.backward(loss);
      return;
    }
    zero_model& model = *models_.front();
    auto run = [&](const at::Tensor& scaled) {
      if (config_.fp16.enabled) model.scaler.scale_loss(scaled).backward();
      else precision.backward(scaled);
    };
    if (k == 1) {
      run(loss);
      return;
    }
    const bool boundary = (model.micro_steps + 1) % k == 0;
    auto engine = model.engine.lock();
    engine->set_sync_enabled(boundary);
    try {
      run(loss / static_cast<double>(k));
    } catch (...) {
      engine->set_sync_enabled(true);
      throw;
    }
    engine->set_sync_enabled(true);
  }

  // DeepSpeed's engine.step: counts the micro-batch; on the boundary clips
  // (gradient_clipping) and steps this rank's partition.
  template <class P>
  void optimizer_step(P& precision, torch::optim::Optimizer& optimizer, optimizer_slot slot) {
    zero_model& model = model_of(optimizer);
    ++model.micro_steps;
    if (model.micro_steps % config_.gradient_accumulation_steps != 0) return;
    if (!model.masters.empty()) {
      step_masters(model, precision, optimizer, slot);
      return;
    }
    // bf16 with the masters on NVMe: the stream scales the fp32 gradients
    // by the clipping coefficient, as the in-memory masters' step does.
    if (model.nvme && config_.bf16) {
      std::vector<at::Tensor> gradients;
      for (auto& parameter : optimizer.param_groups().front().params()) {
        if (parameter.is_floating_point()) gradients.push_back(parameter.grad());
      }
      const double coefficient =
          config_.gradient_clipping > 0 ? clip_coefficient(gradients, config_.gradient_clipping) : 1.0;
      model.nvme->step(hyper_of(optimizer), coefficient);
      return;
    }
    if (config_.gradient_clipping > 0) {
      if (auto engine = model.engine.lock()) engine->clip_gradients(clip_options{.max_norm = config_.gradient_clipping});
    }
    // With the optimizer's state on NVMe its step is streamed (Adam's math, sub-group by sub-group).
    if (model.nvme) model.nvme->step(hyper_of(optimizer));
    else precision.optimizer_step(optimizer, slot);
  }

  // Acts right after the model's boundary step only (between micro-batches
  // its gradients are still accumulating).
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none);

  // Lightning raises here; loom clips (the norm over every partition) unless
  // the config clips already.
  std::optional<double> clip_gradients(module_state& engine, torch::nn::Module& module, const clip_options& options) {
    if (config_.gradient_clipping > 0) {
      throw configuration_error("deepspeed: fabric.clip_gradients and the config's gradient_clipping = " +
                                std::to_string(config_.gradient_clipping) +
                                " would both clip; use one (the config clips inside optimizer.step())");
    }
    return sharded_parallel::clip_gradients(engine, module, options);
  }

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

  const zero_config& config() const noexcept { return config_; }
  const deepspeed_options& arguments() const noexcept { return arguments_; }
  // Micro-batches stepped so far by the model whose optimizer this is
  // (DeepSpeed's micro_steps: each model counts its own).
  std::int64_t micro_steps(const torch::optim::Optimizer& optimizer) const { return model_of(optimizer).micro_steps; }
  // ... of the first model set up (0 before any).
  std::int64_t micro_steps() const noexcept { return models_.empty() ? 0 : models_.front()->micro_steps; }
  // DeepSpeed's loss scaler (fp16, which takes one model).
  const zero_loss_scaler& loss_scaler() const noexcept {
    static const zero_loss_scaler none;
    return models_.empty() ? none : models_.front()->scaler;
  }
  // The NVMe optimizer stream (offload_optimizer.device "nvme"), or nullptr.
  const detail::nvme_stream* nvme() const noexcept {
    const zero_model* owner = nvme_owner();
    return owner == nullptr ? nullptr : owner->nvme.get();
  }
  // Bytes of the fp32 master partitions of every model (bf16 mode).
  std::int64_t master_bytes() const noexcept {
    std::int64_t total = 0;
    for (const auto& t : master_tensors()) total += static_cast<std::int64_t>(t.numel()) * 4;
    return total;
  }
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
  struct nvme_state_in_optimizer {
    explicit nvme_state_in_optimizer(const zero_model& owner);
    nvme_state_in_optimizer(const nvme_state_in_optimizer&) = delete;
    nvme_state_in_optimizer& operator=(const nvme_state_in_optimizer&) = delete;
    ~nvme_state_in_optimizer() { optimizer.state().clear(); }
    torch::optim::Optimizer& optimizer;
  };

  state load_state(const std::string& path, const state& checkpoint, bool strict);

  // bf16: the optimizer steps the fp32 masters with the gradients in fp32
  // (reduced in fp32 already), clipped there; the result is cast back into
  // the bf16 partition.
  template <class P>
  void step_masters(zero_model& model, P& precision, torch::optim::Optimizer& optimizer, optimizer_slot slot) {
    at::NoGradGuard no_grad;
    for (auto& m : model.masters) {
      m.low = m.param.detach();
      m.low_grad = m.param.grad();
      m.param.set_data(m.master);
      m.param.mutable_grad() = m.low_grad.defined() ? m.low_grad.to(at::kFloat) : at::Tensor();
    }
    auto restore = [&] {
      for (auto& m : model.masters) {
        m.param.set_data(m.low);
        m.param.mutable_grad() = m.low_grad;
        m.low = at::Tensor();
        m.low_grad = at::Tensor();
      }
    };
    try {
      if (config_.fp16.enabled) {
        // DeepSpeed: unscale, skip the step if any rank overflowed, clip, step, update the scale.
        const bool overflow = model.scaler.unscale_and_check(optimizer, &group());
        if (!overflow) {
          if (config_.gradient_clipping > 0) clip_masters(model, config_.gradient_clipping);
          optimizer.step();
        }
        model.scaler.update(overflow);
        (void)precision;
        (void)slot;
      } else {
        if (config_.gradient_clipping > 0) clip_masters(model, config_.gradient_clipping);
        precision.optimizer_step(optimizer, slot);
      }
    } catch (...) {
      restore();
      throw;
    }
    for (auto& m : model.masters) m.low.copy_(m.master);
    restore();
  }
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
  zero_model* nvme_owner() const noexcept {
    return models_.size() == 1 && models_.front()->nvme ? models_.front().get() : nullptr;
  }
  bool any_masters() const noexcept {
    for (const auto& model : models_) {
      if (!model->masters.empty()) return true;
    }
    return false;
  }

  deepspeed_options arguments_;
  zero_config config_;
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
