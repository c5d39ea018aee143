// The deepspeed strategy's body (include/loom/strategy/deepspeed.hpp keeps the
// declarations and the forwarding templates a Fabric instantiates per
// precision; the step is deepspeed_step.cpp): configuration, setup, the
// NVMe stream's start, checkpoints, the accessors of the per-model state
// (zero_model.hpp). Compiled once here, so a TU that includes
// <loom/loom.hpp> does not parse it, nor the Adam and AdamW headers it reads
// an optimizer's options with.
#include "zero_model.hpp"

#include <loom/strategy/deepspeed.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <loom/strategy/nvme_stream.hpp>
#include <loom/strategy/zero_config.hpp>
#include <loom/strategy/zero_loss_scaler.hpp>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loom {

deepspeed::deepspeed(deepspeed_options options)
    : sharded_parallel(options.process),
      arguments_(std::move(options)),
      config_(std::make_unique<zero_config>()) {}
deepspeed::deepspeed(deepspeed&&) noexcept = default;
deepspeed& deepspeed::operator=(deepspeed&&) noexcept = default;
deepspeed::~deepspeed() = default;

void deepspeed::setup_environment(const strategy_environment& environment) {
  sharded_parallel::setup_environment(environment);
  *config_ = resolve_zero_config(arguments_, precision_, world_size());
  if (config_->fp16.enabled && !(precision_.mixed && precision_.half())) {
    throw configuration_error("deepspeed: fp16 (DeepSpeed's dynamic loss scaling) takes precision 16-mixed, not " +
                              std::string(precision_.name));
  }
  if (config_->offload_param.device == offload_device::nvme) {
    // ZeRO-Infinity: loom keeps each rank's parameter partition in the same
    // file as its optimizer state (one request per sub-group reads both).
    if (config_->offload_optimizer.device != offload_device::nvme) {
      throw configuration_error("deepspeed: offload_param.device = \"nvme\" needs offload_optimizer.device = "
                                "\"nvme\" too (loom streams each parameter partition with its optimizer state); "
                                "set both, as deepspeed_stage_3_offload_nvme does");
    }
    if (!config_->offload_param.nvme_path.empty() &&
        config_->offload_param.nvme_path != config_->offload_optimizer.nvme_path) {
      throw configuration_error("deepspeed: offload_param.nvme_path '" + config_->offload_param.nvme_path +
                                "' differs from offload_optimizer.nvme_path '" +
                                config_->offload_optimizer.nvme_path +
                                "'; loom keeps both in one file per rank: give them the same directory");
    }
  }
  if (config_->offload_optimizer.device == offload_device::nvme) {
    if (config_->fp16.enabled) {
      throw configuration_error("deepspeed: NVMe optimizer offload under 16-mixed (fp32 masters on NVMe with "
                                "DeepSpeed's loss scaler) is not built yet; it runs under 32-true, bf16-mixed and "
                                "bf16-true");
    }
    // Before training starts: a missing or unwritable nvme_path is named now.
    detail::nvme_stream::check_directory(config_->offload_optimizer.nvme_path);
  }
  if (global_rank() == 0) {
    for (const auto& notice : config_->notices) std::cerr << "loom deepspeed: notice: " << notice << '\n';
  }
  engine_options_ = engine_options(*config_);
}

auto deepspeed::construction_sharding() const -> std::optional<detail::construction_sharding> {
  auto sharding = construction_sharding_of(engine_options_);
  if (sharding && config_->bf16) sharding->dtype = at::kBFloat16;
  if (sharding && config_->fp16.enabled) sharding->dtype = at::kHalf;
  return sharding;
}

auto deepspeed::setup_module_and_optimizers(torch::nn::Module& module,
                                             std::span<torch::optim::Optimizer* const> optimizers,
                                             bool move_to_device) -> module_state {
  if (optimizers.size() != 1) {
    throw configuration_error("deepspeed: fabric.setup takes the module and exactly one optimizer (DeepSpeed "
                              "steps one optimizer per model, as in Lightning); got " +
                              std::to_string(optimizers.size()));
  }
  torch::optim::Optimizer& optimizer = *optimizers.front();
  if (!optimizer.state().empty()) {
    throw configuration_error("deepspeed: the optimizer has already stepped (it holds state for whole "
                              "parameters); set it up before its first step");
  }
  if (!config_->zero_allow_untested_optimizer && !detail::fsdp_engine::knows_state_layout(optimizer)) {
    throw configuration_error("deepspeed: zero_allow_untested_optimizer is false and this optimizer is not one "
                              "loom has tested with ZeRO (SGD, Adam, AdamW, RMSprop, Adagrad)");
  }
  // DeepSpeed's bf16 mode (bf16-mixed and bf16-true alike): the module in
  // bf16 and computed without autocast; each rank keeps an fp32 master of
  // its partition, which the optimizer steps (its state is fp32 too).
  // fp16 (16-mixed) the same in float16, under DeepSpeed's loss scaler.
  const bool nvme = config_->offload_optimizer.device == offload_device::nvme;
  if (!models_.empty() && (nvme || config_->fp16.enabled || config_->gradient_accumulation_steps > 1)) {
    // backward(loss) cannot tell which model a loss belongs to, so it
    // cannot pick a model's loss scale or accumulation boundary; and each
    // rank's NVMe file holds one model's state.
    throw configuration_error(
        "deepspeed: a second model on one Fabric runs without fp16, gradient_accumulation_steps 1 and no NVMe "
        "offload (each model keeps its own loss scale, accumulation boundary and NVMe file, which backward(loss) "
        "cannot tell apart); this config has " +
        std::string(config_->fp16.enabled ? "fp16" : nvme ? "NVMe offload" : "gradient_accumulation_steps = ") +
        (config_->gradient_accumulation_steps > 1 && !config_->fp16.enabled && !nvme
             ? std::to_string(config_->gradient_accumulation_steps)
             : std::string()));
  }
  if (config_->bf16) to_floating(module, at::kBFloat16);
  if (config_->fp16.enabled) to_floating(module, at::kHalf);
  if (move_to_device) module.to(device_);
  module_state engine = add_engine(module, group(), engine_options_);
  auto model = std::make_unique<zero_model>();
  model->module = &module;
  model->optimizer = &optimizer;
  model->engine = engine;
  model->scaler = zero_loss_scaler(config_->fp16);
  if (nvme) start_nvme(*model, *engine);
  // (With the optimizer on NVMe the fp32 masters live in its file.)
  if (sixteen_bit() && !model->nvme) {
    at::NoGradGuard no_grad;
    for (auto& group : optimizer.param_groups()) {
      for (auto& parameter : group.params()) {
        if (parameter.is_floating_point()) {
          model->masters.push_back({parameter, parameter.detach().to(at::kFloat), {}, {}});
        }
      }
    }
  }
  models_.push_back(std::move(model));
  return engine;
}

void deepspeed::zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
  if (model_of(optimizer).micro_steps % config_->gradient_accumulation_steps == 0) {
    sharded_parallel::zero_grad(optimizer, set_to_none);
  }
}

auto deepspeed::no_backward_sync(module_state& engine, bool enabled) -> fsdp_no_sync_guard {
  if (enabled && (config_->offload_optimizer.device != offload_device::none ||
                  config_->offload_param.device != offload_device::none)) {
    throw configuration_error(std::string("no_backward_sync: strategy 'deepspeed' with offloading: ") +
                              detail::offload_refusal_reason);
  }
  if (enabled && config_->gradient_accumulation_steps > 1) {
    throw configuration_error("deepspeed: no_backward_sync with gradient_accumulation_steps = " +
                              std::to_string(config_->gradient_accumulation_steps) +
                              ": the config accumulates already (reductions run on its boundary micro-batches "
                              "only); use one of the two");
  }
  return sharded_parallel::no_backward_sync(engine, enabled);
}

void deepspeed::save_checkpoint(const std::string& path, const state& checkpoint, const state_filter& filter,
                                const checkpoint_metadata& metadata) {
  if (!filter.empty()) {
    throw configuration_error("deepspeed: a filter is refused for ZeRO saves (each rank writes its partition); "
                              "save, then filter the consolidated file (loom-run consolidate)");
  }
  deepspeed_layout layout;
  layout.module_sharded = config_->stage == 3;
  layout.bf16 = config_->bf16;
  state saved = checkpoint;
  std::map<const void*, std::string> names;  // parameter -> its name in the checkpoint's modules
  layout.shards = detail::sharded_save_layout(checkpoint, engines_.entries(), "deepspeed", &names);
  for (const auto& entry : checkpoint.entries()) {
    const torch::nn::Module* module = entry.io().module();
    if (module == nullptr) continue;
    std::set<std::string> frozen;
    for (const auto& item : module->named_parameters()) {
      if (!item.value().requires_grad()) frozen.insert(item.key());
    }
    // DeepSpeed's exclude_frozen_parameters: the module states leave out
    // parameters that do not require grad (load such a save with strict=false).
    if (config_->exclude_frozen_parameters && !frozen.empty()) {
      layout.filter[entry.name()] = [frozen](std::string_view key, const at::Tensor&) {
        return frozen.count(std::string(key)) == 0;
      };
    }
  }
  // What DeepSpeed's engine saves beside the user's state: the fp32 master
  // partitions (bf16/fp16: the weights themselves at full precision, in the
  // optim-states files as DeepSpeed keeps them), the loss scaler and the
  // micro-step count (the accumulation boundary).
  if (any_masters() || (nvme_owner() != nullptr && config_->bf16)) {
    c10::impl::GenericDict masters(c10::StringType::get(), c10::TensorType::get());
    for (const auto& [parameter, master] : master_partitions()) {
      auto name = names.find(parameter.unsafeGetTensorImpl());
      if (name != names.end()) masters.insert(name->second, master);
    }
    saved.set(std::string(masters_key), c10::IValue(masters));
    layout.partition_entries.insert(std::string(masters_key));
  }
  // (fp16 and accumulation take one model: setup refuses a second.)
  if (config_->fp16.enabled && !models_.empty()) {
    saved.set(std::string(scaler_key), models_.front()->scaler.state_dict());
  }
  if (config_->gradient_accumulation_steps > 1 && !models_.empty()) {
    saved.set(std::string(micro_steps_key), c10::IValue(models_.front()->micro_steps));
  }
  // NVMe: the optimizer's state is read back from the file into the
  // optimizer for the save, and dropped after it.
  std::optional<nvme_state_in_optimizer> in_memory;
  if (nvme_owner() != nullptr) in_memory.emplace(*nvme_owner());
  // offload_param: stage 3 writes each rank's slices straight from the shards.
  struct pinned {
    std::vector<std::shared_ptr<detail::fsdp_engine>> live;
    ~pinned() {
      for (auto& engine : live) engine->unpin_shards(/*changed=*/false);
    }
  } shards_in_memory;
  for (const auto& weak : engines_.entries()) {
    if (auto engine = weak.lock()) {
      engine->pin_shards();
      shards_in_memory.live.push_back(std::move(engine));
    }
  }
  const state no_optimizers;
  loom::save_deepspeed_checkpoint(path, saved, metadata, layout, group(),
                                  [&](const std::function<void()>& body) {
                                    with_full_state(no_optimizers, /*root=*/0, body);
                                  });
}

state deepspeed::load_checkpoint(const std::string& path, const state& checkpoint, bool strict) {
  zero_model* const nvme_model = nvme_owner();
  if (nvme_model != nullptr && !nvme_model->optimizer->state().empty()) {
    throw std::logic_error("deepspeed: the NVMe-offloaded optimizer holds state in memory");
  }
  std::optional<optimizer_state_dtype> fp32_state;
  if (sixteen_bit()) fp32_state.emplace(at::kFloat);  // the state of fp32 masters
  state rest = load_state(path, checkpoint, strict);
  fp32_state.reset();
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> saved_masters;
  if (rest.contains(masters_key)) {
    for (const auto& item : rest.get<c10::IValue>(masters_key).toGenericDict()) {
      saved_masters.emplace(item.key().toStringRef(), item.value().toTensor());
    }
  }
  std::map<const void*, std::string> names;
  for (const auto& entry : checkpoint.entries()) {
    if (const torch::nn::Module* module = entry.io().module()) {
      for (const auto& item : module->named_parameters()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
    }
  }
  // With the masters on NVMe: read (the loaded weights, as the engine
  // stored them), overwritten from the save, written back below.
  std::vector<zero_model::master_slot> on_file;
  std::vector<at::Tensor> file_segments;
  if (nvme_model != nullptr && config_->bf16) {
    for (std::size_t s = 0; s < nvme_model->nvme_segments.size(); ++s) {
      at::Tensor segment = at::empty({nvme_model->nvme_segments[s].numel()}, at::kFloat);
      if (config_->offload_param.device == offload_device::nvme) nvme_model->nvme->load_shard(s, segment);
      else segment.copy_(nvme_model->nvme_segments[s]);
      file_segments.push_back(segment);
    }
    for (auto& parameter : nvme_model->optimizer->param_groups().front().params()) {
      const auto [s, offset] = nvme_place(*nvme_model, parameter);
      on_file.push_back({parameter, file_segments[s].narrow(0, offset, parameter.numel()), {}, {}});
    }
  }
  std::vector<zero_model::master_slot*> slots;
  if (nvme_model != nullptr) {
    for (auto& m : on_file) slots.push_back(&m);
  } else {
    for (auto& model : models_) {
      for (auto& m : model->masters) slots.push_back(&m);
    }
  }
  for (zero_model::master_slot* slot : slots) {
    zero_model::master_slot& m = *slot;
    if (m.master.numel() == 0) continue;  // no slice of this parameter on this rank
    // The load read this rank's part of the saved master (keyed by parameter name).
    at::Tensor part;
    if (auto name = names.find(m.param.unsafeGetTensorImpl()); name != names.end()) {
      if (auto found = saved_masters.find(name->second); found != saved_masters.end()) part = found->second;
    }
    if (!part.defined()) {
      if (nvme_model == nullptr) m.master.copy_(m.param.detach());  // (the file's segment holds the loaded weights already)
      continue;
    }
    if (part.numel() != m.master.numel()) {
      throw checkpoint_error("deepspeed: " + path + " holds an fp32 master of '" + names.at(m.param.unsafeGetTensorImpl()) +
                             "' of which this rank's part has " + std::to_string(part.numel()) +
                             " elements, which does not fit this model");
    }
    m.master.copy_(part.reshape(m.master.sizes()));
  }
  for (std::size_t s = 0; s < file_segments.size(); ++s) nvme_model->nvme->store_shard(s, file_segments[s]);
  // (fp16 and accumulation take one model: setup refuses a second.)
  if (!models_.empty()) {
    zero_model& model = *models_.front();
    if (config_->fp16.enabled && rest.contains(scaler_key)) model.scaler.load_state_dict(rest.get<c10::IValue>(scaler_key));
    if (rest.contains(micro_steps_key)) model.micro_steps = rest.get<std::int64_t>(micro_steps_key);
  }
  for (std::string_view key : {masters_key, scaler_key, micro_steps_key}) rest.erase(key);
  if (nvme_model != nullptr) {
    nvme_model->nvme->write_state(nvme_state_from(*nvme_model));
    nvme_model->optimizer->state().clear();
  }
  return rest;
}

std::optional<double> deepspeed::clip_gradients(module_state& engine, torch::nn::Module& module,
                                                const clip_options& options) {
  if (config_->gradient_clipping > 0) {
    throw configuration_error("deepspeed: fabric.clip_gradients and the config's gradient_clipping = " +
                              std::to_string(config_->gradient_clipping) +
                              " would both clip; use one (the config clips inside optimizer.step())");
  }
  return sharded_parallel::clip_gradients(engine, module, options);
}

std::int64_t deepspeed::micro_steps(const torch::optim::Optimizer& optimizer) const {
  return model_of(optimizer).micro_steps;
}

std::int64_t deepspeed::micro_steps() const noexcept { return models_.empty() ? 0 : models_.front()->micro_steps; }

const zero_loss_scaler& deepspeed::loss_scaler() const noexcept {
  static const zero_loss_scaler none;
  return models_.empty() ? none : models_.front()->scaler;
}

const detail::nvme_stream* deepspeed::nvme() const noexcept {
  const zero_model* owner = nvme_owner();
  return owner == nullptr ? nullptr : owner->nvme.get();
}

std::int64_t deepspeed::master_bytes() const noexcept {
  std::int64_t total = 0;
  for (const auto& t : master_tensors()) total += static_cast<std::int64_t>(t.numel()) * 4;
  return total;
}

auto deepspeed::master_tensors() const -> std::vector<at::Tensor> {
  std::vector<at::Tensor> out;
  for (const auto& model : models_) {
    for (const auto& m : model->masters) out.push_back(m.master);
  }
  return out;
}

auto deepspeed::master_partitions() const -> std::vector<std::pair<at::Tensor, at::Tensor>> {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  const zero_model* owner = nvme_owner();
  if (owner == nullptr) {
    for (const auto& model : models_) {
      for (const auto& m : model->masters) out.emplace_back(m.param, m.master);
    }
    return out;
  }
  std::vector<at::Tensor> segments;
  for (std::size_t s = 0; s < owner->nvme_segments.size(); ++s) {
    segments.push_back(at::empty({owner->nvme_segments[s].numel()}, at::kFloat));
    owner->nvme->load_shard(s, segments.back());
  }
  for (auto& parameter : owner->optimizer->param_groups().front().params()) {
    if (!parameter.is_floating_point()) continue;
    const auto [s, offset] = nvme_place(*owner, parameter);
    out.emplace_back(parameter, segments[s].narrow(0, offset, parameter.numel()).clone());
  }
  return out;
}

void deepspeed::to_floating(torch::nn::Module& module, c10::ScalarType dtype) {
  at::NoGradGuard no_grad;
  for (auto& parameter : module.parameters()) {
    if (parameter.is_floating_point()) parameter.set_data(parameter.to(dtype));
  }
  for (auto& buffer : module.buffers()) {
    if (buffer.is_floating_point()) buffer.set_data(buffer.to(dtype));
  }
}

void deepspeed::start_nvme(zero_model& model, detail::fsdp_engine& engine) {
  (void)hyper_of(*model.optimizer);  // Adam or AdamW, one group: refused otherwise
  std::vector<at::Tensor> parameters, gradients;
  for (auto& [parameter, gradient] : engine.partitions()) {
    parameters.push_back(parameter);
    gradients.push_back(gradient);
  }
  model.nvme_segments = parameters;
  const auto& offload = config_->offload_optimizer;
  model.nvme = std::make_unique<detail::nvme_stream>(
      detail::nvme_stream_options{.directory = offload.nvme_path,
                                  .rank = global_rank(),
                                  .sub_group_size = config_->sub_group_size,
                                  .buffer_count = static_cast<int>(offload.buffer_count),
                                  .queue_depth = static_cast<int>(config_->aio.queue_depth),
                                  .block_size = config_->aio.block_size,
                                  .parameters = config_->offload_param.device == offload_device::nvme,
                                  .masters = config_->bf16},
      std::move(parameters), std::move(gradients));
  if (config_->offload_param.device == offload_device::nvme) engine.set_shard_store(model.nvme.get());
}

auto deepspeed::hyper_of(torch::optim::Optimizer& optimizer) -> detail::adam_hyper {
  if (optimizer.param_groups().size() != 1) {
    throw configuration_error("deepspeed: NVMe optimizer offload takes an optimizer with one parameter group; it "
                              "has " + std::to_string(optimizer.param_groups().size()));
  }
  auto& options = optimizer.param_groups().front().options();
  if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    if (adamw->amsgrad()) throw configuration_error("deepspeed: NVMe optimizer offload does not stream amsgrad");
    return {adamw->lr(), std::get<0>(adamw->betas()), std::get<1>(adamw->betas()), adamw->eps(),
            adamw->weight_decay(), /*decoupled=*/true};
  }
  if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    if (adam->amsgrad()) throw configuration_error("deepspeed: NVMe optimizer offload does not stream amsgrad");
    return {adam->lr(), std::get<0>(adam->betas()), std::get<1>(adam->betas()), adam->eps(), adam->weight_decay(),
            /*decoupled=*/false};
  }
  throw configuration_error("deepspeed: NVMe optimizer offload streams Adam's and AdamW's state (DeepSpeed's "
                            "offloaded optimizers are Adam variants); pass torch::optim::Adam or AdamW");
}

auto deepspeed::nvme_place(const zero_model& model, const at::Tensor& parameter)
    -> std::pair<std::size_t, std::int64_t> {
  for (std::size_t s = 0; s < model.nvme_segments.size(); ++s) {
    const at::Tensor& segment = model.nvme_segments[s];
    if (parameter.storage().is_alias_of(segment.storage())) {
      return {s, parameter.storage_offset() - segment.storage_offset()};
    }
  }
  throw std::logic_error("deepspeed: a parameter outside every NVMe-offloaded partition");
}

auto deepspeed::nvme_state_from(const zero_model& model) -> detail::adam_partition_state {
  torch::optim::Optimizer& optimizer = *model.optimizer;
  detail::adam_partition_state out;
  for (const auto& segment : model.nvme_segments) {
    out.exp_avg.push_back(at::zeros({segment.numel()}, at::kFloat));
    out.exp_avg_sq.push_back(at::zeros({segment.numel()}, at::kFloat));
  }
  for (auto& parameter : optimizer.param_groups().front().params()) {
    auto found = optimizer.state().find(compat::optimizer_state_key(parameter));
    if (found == optimizer.state().end()) continue;
    at::Tensor exp_avg, exp_avg_sq;
    std::int64_t step = 0;
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(found->second.get())) {
      exp_avg = adam->exp_avg(), exp_avg_sq = adam->exp_avg_sq(), step = adam->step();
    } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(found->second.get())) {
      exp_avg = adamw->exp_avg(), exp_avg_sq = adamw->exp_avg_sq(), step = adamw->step();
    } else {
      continue;
    }
    const auto [s, offset] = nvme_place(model, parameter);
    out.exp_avg[s].narrow(0, offset, parameter.numel()).copy_(exp_avg.reshape({-1}));
    out.exp_avg_sq[s].narrow(0, offset, parameter.numel()).copy_(exp_avg_sq.reshape({-1}));
    out.step = std::max(out.step, step);
  }
  if (out.step == 0) out.exp_avg.clear(), out.exp_avg_sq.clear();
  return out;
}

state deepspeed::load_state(const std::string& path, const state& checkpoint, bool strict) {
  if (!config_->load_full_weights) return sharded_parallel::load_checkpoint(path, checkpoint, strict);
  if (std::filesystem::is_directory(path)) {
    throw configuration_error("deepspeed: load_full_weights=True loads one full checkpoint file (a full save, or "
                              "loom-run consolidate's output); " + path + " is a directory");
  }
  state modules;
  for (const auto& entry : checkpoint.entries()) {
    if (entry.io().module() != nullptr) modules.add(entry);
  }
  (void)sharded_parallel::load_checkpoint(path, modules, strict);
  return {};
}

auto deepspeed::preset(deepspeed_options options, int stage, bool offload_optimizer, bool offload_parameters,
                       bool nvme) -> deepspeed_options {
  options.stage = stage;
  options.offload_optimizer = options.offload_optimizer || offload_optimizer;
  options.offload_parameters = options.offload_parameters || offload_parameters;
  if (nvme) {
    options.remote_device = "nvme";
    options.offload_params_device = "nvme";
    options.offload_optimizer_device = "nvme";
  }
  return options;
}

auto deepspeed::engine_options(const zero_config& config) const -> fsdp_options {
  fsdp_options engine;  // its `process` is not read: the processes are the strategy's
  engine.strategy = config.stage == 3   ? sharding_strategy::full_shard
                    : config.stage == 0 ? sharding_strategy::no_shard
                                        : sharding_strategy::shard_grad_op;
  engine.keep_full_gradients = config.stage == 1;
  // Buckets are units: a module whose parameters not yet in a unit reach
  // reduce_bucket_size becomes one (besides the model's loom::unit<M>).
  engine.wrap_policy = auto_wrap_policy::size_based(config.reduce_bucket_size);
  engine.forward_prefetch = engine.backward_prefetch = config.overlap_comm;
  engine.cpu_offload = config.offload_optimizer.device == offload_device::cpu ||
                       config.offload_param.device == offload_device::cpu;
  if (!config.communication_data_type.empty()) {
    const auto dtype = config.communication_data_type == "fp16"   ? at::kHalf
                       : config.communication_data_type == "bf16" ? at::kBFloat16
                                                                   : at::kFloat;
    engine.mixed_precision = fsdp_mixed_precision{.reduce_dtype = dtype};
  }
  // bf16: Gloo cannot move bf16, and DeepSpeed reduces bf16 gradients in fp32.
  if (config.bf16 && config.communication_data_type.empty()) {
    engine.mixed_precision = fsdp_mixed_precision{.reduce_dtype = at::kFloat};
  }
  engine.state_dict = state_dict_type::sharded;
  return engine;
}

auto deepspeed::model_of(const torch::optim::Optimizer& optimizer) const -> zero_model& {
  for (const auto& model : models_) {
    if (model->optimizer == &optimizer) return *model;
  }
  throw configuration_error("deepspeed: this optimizer was not set up with a model (fabric.setup(module, "
                            "optimizer)); step and zero_grad the optimizer fabric.setup returned");
}

auto deepspeed::nvme_owner() const noexcept -> zero_model* {
  return models_.size() == 1 && models_.front()->nvme ? models_.front().get() : nullptr;
}

bool deepspeed::sixteen_bit() const noexcept { return config_->bf16 || config_->fp16.enabled; }

bool deepspeed::any_masters() const noexcept {
  for (const auto& model : models_) {
    if (!model->masters.empty()) return true;
  }
  return false;
}

deepspeed::nvme_state_in_optimizer::nvme_state_in_optimizer(const zero_model& owner) : optimizer(*owner.optimizer) {
  const detail::adam_partition_state state = owner.nvme->read_state();
  if (state.step == 0) return;
  const bool decoupled = hyper_of(optimizer).decoupled;
  for (auto& parameter : optimizer.param_groups().front().params()) {
    const auto [s, offset] = nvme_place(owner, parameter);
    at::Tensor exp_avg = state.exp_avg[s].narrow(0, offset, parameter.numel()).view_as(parameter).clone();
    at::Tensor exp_avg_sq = state.exp_avg_sq[s].narrow(0, offset, parameter.numel()).view_as(parameter).clone();
    if (decoupled) {
      auto made = std::make_unique<torch::optim::AdamWParamState>();
      made->step(state.step).exp_avg(exp_avg).exp_avg_sq(exp_avg_sq);
      optimizer.state()[compat::optimizer_state_key(parameter)] = std::move(made);
    } else {
      auto made = std::make_unique<torch::optim::AdamParamState>();
      made->step(state.step).exp_avg(exp_avg).exp_avg_sq(exp_avg_sq);
      optimizer.state()[compat::optimizer_state_key(parameter)] = std::move(made);
    }
  }
}

}  // namespace loom
