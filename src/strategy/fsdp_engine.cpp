// The sharding engine (fsdp_engine.hpp). How a unit moves through a step:
//
//   forward    pre_forward: wait for its gather (issued ahead by the unit
//              before it), point its parameters at the gathered buffer,
//              issue the next unit's gather; the module's own forward;
//              post_forward: parameters back to their shard slices, the
//              gathered buffer freed (FULL_SHARD) or kept (SHARD_GRAD_OP),
//              a hook on each output that needs a gradient.
//   backward   the first output hook (pre_backward): gather again (issued
//              ahead by the unit after it), parameters full-sized, each
//              gradient a view of one zeroed flat gradient buffer, the
//              previous unit's gather issued. AccumulateGrad adds every
//              gradient into that buffer; its post hook counts them, and
//              the last one (post_backward) issues the reduce-scatter,
//              frees the gathered parameters and waits for the reduction
//              issued before it. The autograd engine's final callback
//              finishes what is left (units with unused parameters, the
//              last reductions).
//
// Saved activations keep views of the gathered storage: freeing empties the
// storage (its bytes go back to the allocator) and gathering refills the
// same storage, so those views are valid again exactly when backward reads
// them. The parameters' own tensors are re-pointed with set_data, which
// keeps their version counters; the gathered views have counters of their
// own, so refilling bumps nothing autograd checks.
//
// This file is the schedule; setup's layout is fsdp_layout.cpp, a unit and
// its states fsdp_unit.hpp, the collectives fsdp_comm.cpp
// (docs/architecture.md, "The sharding engine").
#include "fsdp_comm.hpp"
#include "fsdp_layout.hpp"
#include "fsdp_unit.hpp"
#include "flat_storage.hpp"

#include <loom/errors.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <loom/strategy/unit.hpp>

#include "../checkpoint/optimizer_state.hpp"
#include "../util/optimizer_families.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <set>

namespace loom::detail {

namespace {

// A gradient shard setup left without storage (sharded_unit::grad_shard_pending),
// given its storage, zeroed: no gradient has been reduced into it yet.
void ensure_grad_shard(sharded_unit& unit) {
  if (!unit.grad_shard_pending) return;
  allocate_storage(unit.grad_shard, bytes_of(unit.grad_shard));
  unit.grad_shard.zero_();
  unit.grad_shard_pending = false;
}

constexpr const char* outlived_module =
    "loom fsdp: backward reached a module whose setup is gone: the module fabric.setup returned (and with it the "
    "sharding engine that gathers its parameters for backward) was destroyed while a tensor computed through it "
    "was still alive. Keep the set-up module alive until the backward of everything computed through it is done.";

}  // namespace

struct fsdp_engine::impl : std::enable_shared_from_this<fsdp_engine::impl> {
  // Where a step stands, for the engine as a whole: a forward that did not
  // reach its end, or a backward whose final callback did not run, left the
  // units mid-step (an exception inside them), and the next root pre-forward
  // recovers them. A finished forward waits for its backward (or another
  // forward, as a loss summed over two batches does) in forward_done.
  enum class step_phase : std::uint8_t { idle, forward, forward_done, backward };

  impl(comm::process_group& world, const fsdp_options& options, int ranks_per_node)
      : options(options), comm(world, options, ranks_per_node), global_rank(world.rank()) {}

  fsdp_options options;
  fsdp_comm comm;
  int global_rank = 0;
  std::vector<std::unique_ptr<sharded_unit>> units;  // [0] is the root
  std::vector<sharded_unit*> forward_order;          // sub-units with a hook, as the last forward ran them
  std::size_t forward_cursor = 0;
  bool sync = true;
  step_phase phase = step_phase::idle;
  // The one reduction left in flight behind the backward (none: nullptr).
  sharded_unit* reduction_in_flight = nullptr;

  // ZeRO-1: the full gradient buffer stays; the shard is its own chunk.
  bool keeps_gradients() const noexcept { return comm.sharded() && options.keep_full_gradients; }
  // Where a unit's reduction lands: apart (`reduced`, added to the shard when
  // finished) where the shard already holds gradients from an unsynced
  // backward, else straight into the shard.
  bool reduces_apart(const sharded_unit& unit) const noexcept {
    return comm.sharded() && unit.had_grad && !keeps_gradients();
  }
  at::Tensor& reduction_target(sharded_unit& unit) const noexcept {
    return reduces_apart(unit) ? unit.reduced : unit.grad_shard;
  }
  // SHARD_GRAD_OP (ZeRO stages 1 and 2): each unit's gathered storage stays
  // allocated from its forward to its backward and between steps.
  bool keeps_gathered_storage() const noexcept { return options.strategy == sharding_strategy::shard_grad_op; }
  bool frees_after_forward(const sharded_unit& unit) const noexcept {
    return comm.sharded() && unit.marker != nullptr && !keeps_gathered_storage();
  }

  // ------------------------------------------------------------ gathering
  void gather_ahead(sharded_unit& unit, bool prefetch) {
    if (unit.sharding == sharded_state::sharded) comm.issue_gather(unit, prefetch);
  }
  void ensure_gathered(sharded_unit& unit) {
    if (unit.full_valid()) return;
    gather_ahead(unit, false);
    comm.wait_gather(unit);
  }
  void point_full(sharded_unit& unit) {
    if (unit.sharding == sharded_state::unsharded) return;
    move_sharded(unit, sharded_state::gathered, sharded_state::unsharded);
    for (auto& p : unit.params) p.param.set_data(p.full_view);
  }
  void point_shard(sharded_unit& unit) {
    if (unit.sharding != sharded_state::unsharded) return;
    for (auto& p : unit.params) p.param.set_data(p.shard_view);
    unit.sharding = sharded_state::gathered;
  }
  // The parameters back to their shards. FULL_SHARD empties the gathered
  // storage; SHARD_GRAD_OP keeps it allocated between steps (ZeRO-2's 4 bytes
  // per parameter: the next step's gather refills it, allocating nothing).
  // Unsharded, or without parameters, a unit stays gathered.
  void release(sharded_unit& unit) {
    point_shard(unit);
    if (!comm.sharded() || unit.params.empty() || unit.sharding != sharded_state::gathered) return;
    if (!keeps_gathered_storage()) free_storage(unit.full);
    move_sharded(unit, sharded_state::gathered, sharded_state::sharded);
  }
  void finish_gather_and_release(sharded_unit& unit) {
    if (unit.sharding == sharded_state::gathering) comm.wait_gather(unit);
    release(unit);
  }

  // ------------------------------------------------------------- forward
  void pre_forward(sharded_unit& unit) {
    if (phase == step_phase::backward) {
      // Recomputed in backward (inside a checkpointed unit): no new order, no prefetch.
      ensure_gathered(unit);
      point_full(unit);
      return;
    }
    move_training(unit, training_state::idle, training_state::forward);
    if (unit.forward_position < 0 || forward_cursor >= forward_order.size() ||
        forward_order[forward_cursor] != &unit) {
      // First step, or the order changed: record it (prefetch follows the record).
      if (forward_cursor < forward_order.size()) forward_order.resize(forward_cursor);
      forward_order.push_back(&unit);
      unit.forward_position = static_cast<int>(forward_cursor);
    }
    ++forward_cursor;
    ensure_gathered(unit);
    point_full(unit);
    if (options.forward_prefetch && forward_cursor < forward_order.size()) {
      gather_ahead(*forward_order[forward_cursor], true);
    }
  }

  // The unit's backward starts at the first gradient reaching one of its
  // outputs. The hook holds the engine weakly: a tensor may outlive it.
  void watch(sharded_unit& unit, const at::Tensor& output) {
    if (!output.defined() || !output.requires_grad()) return;
    ++unit.watched_outputs;
    output.register_hook([engine = weak_from_this(), index = unit.index](const at::Tensor&) {
      const std::shared_ptr<impl> self = engine.lock();
      if (!self) throw usage_error(outlived_module);
      self->pre_backward(*self->units[static_cast<std::size_t>(index)]);
    });
  }

  void post_forward(sharded_unit& unit) {
    point_shard(unit);
    if (frees_after_forward(unit) || unit.watched_outputs == 0) release(unit);
    unit.watched_outputs = 0;
    if (phase != step_phase::backward) move_training(unit, training_state::forward, training_state::idle);
  }

  // The root and the plain modules auto_wrap_policy chose (no forward of
  // their own to hook) are gathered for the whole forward.
  void root_pre_forward() {
    if (phase == step_phase::forward || phase == step_phase::backward) recover();
    phase = step_phase::forward;
    forward_cursor = 0;
    for (auto& unit : units) {
      if (unit->marker == nullptr) gather_ahead(*unit, false);
    }
    for (auto& unit : units) {
      if (unit->marker == nullptr) {
        ensure_gathered(*unit);
        point_full(*unit);
      }
    }
    // Where every unit's gathered storage stays between steps, all of the
    // forward's gathers can be in flight at once at no memory cost: the
    // first unit then waits for its own gather only, and each
    // later one finds its gather done or nearly (ZeRO-1's forward 12.3 ->
    // 10.5 ms in loom-bench's split on 2 ranks; docs/deepspeed.md has the
    // bench/zero_vs_torch.sh ratios). FULL_SHARD keeps one ahead.
    if (options.forward_prefetch && !forward_order.empty()) {
      if (keeps_gathered_storage()) {
        for (sharded_unit* unit : forward_order) gather_ahead(*unit, true);
      } else {
        gather_ahead(*forward_order.front(), true);
      }
    }
  }

  void root_post_forward() {
    sharded_unit& root = *units[0];
    const bool backward_follows = root.watched_outputs > 0;
    root.watched_outputs = 0;
    for (auto& unit : units) {
      if (unit->marker != nullptr) continue;
      point_shard(*unit);
      if (!backward_follows) release(*unit);
    }
    if (!backward_follows) {
      // No backward will free what stayed gathered (SHARD_GRAD_OP, prefetched).
      for (auto& unit : units) finish_gather_and_release(*unit);
    }
    phase = backward_follows ? step_phase::forward_done : step_phase::idle;
  }

  // ------------------------------------------------------------ backward
  void pre_backward(sharded_unit& unit) {
    if (unit.training != training_state::idle) return;  // its backward started already
    if (phase != step_phase::backward) {
      phase = step_phase::backward;
      torch::autograd::Engine::get_default_engine().queue_callback([engine = weak_from_this()] {
        if (const std::shared_ptr<impl> self = engine.lock()) self->end_of_backward();
      });
    }
    start_backward(unit);
    if (unit.index == 0) {
      for (auto& other : units) {
        if (other->marker == nullptr && other->training == training_state::idle) start_backward(*other);
      }
    }
    if (options.backward_prefetch && unit.forward_position > 0 &&
        static_cast<std::size_t>(unit.forward_position) <= forward_order.size()) {
      gather_ahead(*forward_order[static_cast<std::size_t>(unit.forward_position - 1)], true);
    }
  }

  void start_backward(sharded_unit& unit) {
    move_training(unit, training_state::idle, training_state::backward);
    unit.grads_seen = 0;
    ensure_gathered(unit);
    point_full(unit);
    if (!unit.grads_live) prepare_gradients(unit);
    for (auto& p : unit.params) {
      if (p.requires_grad) p.param.mutable_grad() = p.grad_view;
    }
  }

  // The full gradient buffer AccumulateGrad adds into, zeroed; the gradients
  // already there (accumulated before this backward) set aside, to be added
  // to the reduction.
  void prepare_gradients(sharded_unit& unit) {
    ensure_grad_shard(unit);
    unit.had_grad = false;
    for (auto& p : unit.params) unit.had_grad = unit.had_grad || p.param.grad().defined();
    if (keeps_gradients() && unit.had_grad) {
      // The shard is a chunk of the buffer zeroed below: the gradients
      // there are set aside and added back after the reduction.
      unit.reduced = unit.grad_shard.clone();
      for (auto& p : unit.params) {
        if (!p.param.grad().defined() && p.grad_shard_view.numel() > 0) {
          unit.reduced.narrow(0, p.local_offset - comm.shard_rank() * unit.shard_numel, p.grad_shard_view.numel())
              .zero_();
        }
      }
    }
    if (comm.sharded()) {
      allocate_storage(unit.full_grad, bytes_of(unit.full_grad));
      unit.full_grad.zero_();
    } else if (!unit.had_grad) {
      unit.full_grad.zero_();  // unsharded: the gradient buffer is the shard itself
    }
    if (unit.had_grad && !keeps_gradients()) {
      for (auto& p : unit.params) {
        if (!p.param.grad().defined()) p.grad_shard_view.zero_();
      }
    }
    unit.grads_live = true;
  }

  void gradient_ready(sharded_unit& unit) {
    if (unit.training != training_state::backward) return;
    if (++unit.grads_seen == unit.grads_expected) post_backward(unit);
  }

  void post_backward(sharded_unit& unit) {
    move_training(unit, training_state::backward, training_state::reduced);
    if (!sync || unit.params.empty()) {
      // Unsynced, gradients stay in the full buffer; the next backward adds to it.
      for (auto& p : unit.params) p.param.mutable_grad().reset();
      if (unit.params.empty()) unit.grads_live = false;
      release(unit);
      return;
    }
    // Sharded, a fresh reduction is added to the gradients there (ZeRO-1 set
    // them aside at the start of backward and reduces into its chunk).
    if (reduces_apart(unit)) unit.reduced = at::empty_like(unit.grad_shard);
    comm.issue_reduction(unit, reduction_target(unit));
    release(unit);
    // One reduction stays in flight behind this unit's backward; the one
    // before is finished now, so its full gradient buffer is freed.
    finish_reduction_in_flight();
    reduction_in_flight = &unit;
  }

  void finish_reduction_in_flight() {
    if (reduction_in_flight != nullptr) finish_reduction(*reduction_in_flight);
    reduction_in_flight = nullptr;
  }

  void finish_reduction(sharded_unit& unit) {
    if (!unit.reduction_pending) return;
    comm.finish_reduction(unit, reduction_target(unit));
    if (comm.sharded()) {
      if (unit.had_grad) unit.grad_shard.add_(unit.reduced);
      unit.reduced = at::Tensor();
      if (!keeps_gradients()) free_storage(unit.full_grad);
    }
    comm.gradient_to_host();
    unit.grads_live = false;
    for (auto& p : unit.params) {
      if (p.requires_grad) p.param.mutable_grad() = p.grad_shard_view;
    }
  }

  // The autograd engine's final callback.
  void end_of_backward() {
    for (auto& unit : units) {
      if (unit->training == training_state::backward) post_backward(*unit);
    }
    finish_reduction_in_flight();
    for (auto& unit : units) {
      finish_gather_and_release(*unit);
      if (unit->training == training_state::reduced) {
        move_training(*unit, training_state::reduced, training_state::idle);
      }
    }
    comm.release_buffers();
    phase = step_phase::idle;
  }

  // The step before did not finish: an exception inside its forward or
  // backward (on every rank alike: otherwise the ranks' collectives no longer
  // match, the watchdog's case). What it left in flight completes, its
  // gathered buffers go, and every gradient the engine holds is dropped (set
  // to none, as zero_grad would): the failed backward's partial sums cannot be
  // told from what was accumulated before it.
  void recover() {
    for (auto& unit : units) {
      if (unit->reduction_pending) {
        unit->reduction.wait();
        unit->reduction_pending = false;
      }
      unit->low_in = unit->low_out = unit->reduced = at::Tensor();
      if (unit->sharding == sharded_state::gathering) comm.wait_gather(*unit);
      for (auto& p : unit->params) p.param.mutable_grad().reset();
      if (comm.sharded() && !keeps_gradients()) free_storage(unit->full_grad);
      unit->grads_live = false;
      unit->had_grad = false;
      release(*unit);
      unit->training = training_state::idle;
      unit->watched_outputs = 0;
      unit->grads_seen = 0;
    }
    reduction_in_flight = nullptr;
    comm.release_buffers();
    phase = step_phase::idle;
  }
};

// ---------------------------------------------------------------- hooks
void unit_pre_forward(sharded_unit& unit) { unit.engine->pre_forward(unit); }
void unit_watch_output(sharded_unit& unit, const at::Tensor& output) { unit.engine->watch(unit, output); }
void unit_post_forward(sharded_unit& unit) { unit.engine->post_forward(unit); }
bool unit_checkpoints(const sharded_unit& unit) { return unit.checkpoint; }

namespace {

// AccumulateGrad's post hook: one parameter's gradient is in the buffer.
// Removed by the engine's destructor; it holds the engine weakly all the same.
class gradient_ready_hook final : public torch::autograd::FunctionPostHook {
 public:
  gradient_ready_hook(std::weak_ptr<fsdp_engine::impl> engine, int unit) : engine_(std::move(engine)), unit_(unit) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    const std::shared_ptr<fsdp_engine::impl> engine = engine_.lock();
    if (!engine) throw usage_error(outlived_module);
    engine->gradient_ready(*engine->units[static_cast<std::size_t>(unit_)]);
    return outputs;
  }

 private:
  std::weak_ptr<fsdp_engine::impl> engine_;
  int unit_;
};

// The dtype gradients are reduced in: Lightning's mapping
// (FSDPPrecision.mixed_precision_config), overridden field by field by the
// mixed_precision option, whose buffer_dtype converts the buffers now.
std::optional<c10::ScalarType> reduce_dtype_of(torch::nn::Module& module, const fsdp_options& options,
                                               const precision_dtypes& precision) {
  std::optional<c10::ScalarType> reduce_dtype;
  if (precision.mixed && precision.bfloat()) reduce_dtype = at::kBFloat16;
  if (!options.mixed_precision) return reduce_dtype;
  const fsdp_mixed_precision& mixed = *options.mixed_precision;
  if (mixed.reduce_dtype) reduce_dtype = mixed.reduce_dtype;
  for (const auto& p : module.parameters()) {
    if (mixed.param_dtype && *mixed.param_dtype != p.scalar_type()) {
      throw configuration_error(
          std::string("fsdp: mixed_precision.param_dtype = ") + c10::toString(*mixed.param_dtype) +
          ", but the parameters are " + c10::toString(p.scalar_type()) + " (under precision " +
          std::string(precision.name) + "); gathering in another dtype than the parameters' is not built yet: leave "
          "param_dtype unset, or choose the precision that gives the parameters that dtype (bf16-true)");
    }
  }
  if (mixed.buffer_dtype) {
    at::NoGradGuard no_grad;
    for (auto& buffer : module.buffers()) {
      if (buffer.is_floating_point()) buffer.set_data(buffer.to(*mixed.buffer_dtype));
    }
  }
  return reduce_dtype;
}

// The device the parameters compute on; cpu_offload is built for cpu only.
c10::Device compute_device_of(torch::nn::Module& module, const fsdp_options& options) {
  c10::Device device(c10::DeviceType::CPU);
  for (const auto& p : module.parameters()) {
    if (options.cpu_offload && !p.device().is_cpu()) {
      throw configuration_error("fsdp: cpu_offload (fsdp_cpu_offload) keeps the shards on the CPU between uses; "
                                "on " + p.device().str() + " that move is not built yet. On cpu it is the "
                                "identity: use accelerator cpu, or fsdp without offload");
    }
    device = p.device();
  }
  return device;
}

const fsdp_options& checked(const fsdp_options& options) {
  if (options.keep_full_gradients && options.strategy != sharding_strategy::shard_grad_op) {
    throw configuration_error("fsdp: keep_full_gradients (ZeRO stage 1) needs sharding_strategy SHARD_GRAD_OP, not " +
                              std::string(to_string(options.strategy)));
  }
  return options;
}

}  // namespace

// ------------------------------------------------------------------ setup
fsdp_engine::fsdp_engine(torch::nn::Module& module, comm::process_group& world, const fsdp_options& options,
                         int ranks_per_node, const precision_dtypes& precision)
    : impl_(std::make_shared<impl>(world, checked(options), ranks_per_node)) {
  impl& self = *impl_;
  self.comm.set_reduce_dtype(reduce_dtype_of(module, options, precision));
  self.comm.set_offload(options.cpu_offload, compute_device_of(module, options));
  self.units = lay_out_units(module, options, self.comm, world);
  for (auto& unit : self.units) {
    unit->engine = &self;
    for (auto& p : unit->params) {
      if (p.accumulator) {
        p.hook_key = p.accumulator->add_post_hook(std::make_unique<gradient_ready_hook>(impl_, unit->index));
      }
    }
    if (unit->marker != nullptr) unit->marker->attach(unit.get());
  }
  // Buffers (batch-norm statistics) stay replicated: rank 0's everywhere.
  if (options.sync_module_states && world.valid()) {
    for (auto& buffer : module.buffers()) {
      at::Tensor b = buffer;
      world.broadcast(b, 0);
    }
  }
}

fsdp_engine::~fsdp_engine() {
  if (!impl_) return;
  for (auto& unit : impl_->units) {
    if (unit->marker != nullptr) unit->marker->attach(nullptr);
    for (auto& p : unit->params) {
      if (p.accumulator) p.accumulator->del_post_hook(p.hook_key);
    }
  }
}

void fsdp_engine::root_pre_forward() { impl_->root_pre_forward(); }
void fsdp_engine::root_watch_output(const at::Tensor& output) { impl_->watch(*impl_->units[0], output); }
void fsdp_engine::root_post_forward() { impl_->root_post_forward(); }
bool fsdp_engine::sync_enabled() const noexcept { return impl_->sync; }
void fsdp_engine::set_sync_enabled(bool enabled) noexcept { impl_->sync = enabled; }
const fsdp_counters& fsdp_engine::counters() const noexcept { return impl_->comm.counters(); }
int fsdp_engine::shard_size() const noexcept { return impl_->comm.shard_size(); }
int fsdp_engine::replicate_size() const noexcept { return impl_->comm.replicate_size(); }
bool fsdp_engine::cpu_offload() const noexcept { return impl_->comm.offload(); }

void fsdp_engine::zero_grad() {
  for (auto& unit : impl_->units) {
    for (auto& p : unit->params) p.param.mutable_grad().reset();
  }
}

std::optional<double> fsdp_engine::clip_gradients(const clip_options& options) {
  // Each rank holds its slice of every gradient (the norm over placements).
  return clip_placed(placements(), options);
}

void fsdp_engine::gather_full_parameters(int root,
                                         const std::function<void(const std::string&, const at::Tensor&)>& visit) {
  impl& self = *impl_;
  for (auto& unit : self.units) {
    if (unit->params.empty()) continue;
    const bool was_gathered = unit->full_valid();
    self.ensure_gathered(*unit);
    for (auto& p : unit->params) {
      if (root < 0 || root == self.global_rank) {
        for (const auto& name : p.names) visit(name, p.full_view);
      }
    }
    if (!was_gathered) self.release(*unit);
  }
}

std::vector<placement> fsdp_engine::placements() const {
  const impl& self = *impl_;
  std::vector<placement> out;
  for (const auto& unit : self.units) {
    for (const auto& p : unit->params) {
      placement where{.parameter = p.param, .local = p.shard_view, .engine_owned = true, .shape = p.shape};
      if (self.comm.sharded()) {
        where.offset = p.offset;
        where.stride = unit->shard_numel;
        where.slice_group = self.comm.shard_group();
      }
      if (self.comm.replicate_group().valid()) where.replicated_over.push_back(self.comm.replicate_group());
      out.push_back(std::move(where));
    }
  }
  return out;
}

const torch::nn::Module& fsdp_engine::module() const { return *impl_->units.front()->module; }

void fsdp_engine::after_full_state(bool changed) {
  // The scope pointed the parameters back at their shards itself.
  for (auto& unit : impl_->units) {
    if (unit->sharding == sharded_state::unsharded) unit->sharding = sharded_state::gathered;
  }
  unpin_shards(changed);
}

bool fsdp_engine::knows_state_layout(torch::optim::Optimizer& optimizer) {
  return for_each_state_tensor(optimizer, [](const at::Tensor&, std::string_view, at::Tensor&) {});
}

std::vector<unit_summary> fsdp_engine::units() const {
  std::vector<unit_summary> out;
  for (const auto& unit : impl_->units) out.push_back({unit->name, unit->numel, unit->padded, unit->shard_numel, unit->checkpoint});
  return out;
}

std::vector<std::pair<at::Tensor, at::Tensor>> fsdp_engine::partitions() const {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (const auto& unit : impl_->units) {
    if (unit->params.empty()) continue;
    ensure_grad_shard(*unit);  // ZeRO's optimizer reads it at its step
    out.emplace_back(unit->shard, unit->grad_shard);
  }
  return out;
}

void fsdp_engine::pin_shards() {
  impl& self = *impl_;
  if (self.comm.store() == nullptr) return;
  self.comm.pin();
  for (auto& unit : self.units) self.comm.shard_in(*unit);
}

void fsdp_engine::unpin_shards(bool changed) {
  impl& self = *impl_;
  if (self.comm.store() == nullptr) return;
  self.comm.unpin();
  for (auto& unit : self.units) {
    if (unit->params.empty()) continue;
    if (changed) self.comm.store()->store_shard(static_cast<std::size_t>(unit->partition), unit->shard);
    if (unit->sharding == sharded_state::sharded) self.comm.shard_out(*unit);
  }
}

void fsdp_engine::set_shard_store(shard_store* store) {
  impl& self = *impl_;
  if (store != nullptr && (!self.comm.sharded() || self.options.strategy != sharding_strategy::full_shard)) {
    throw configuration_error("fsdp: parameter shards kept outside memory need FULL_SHARD (ZeRO stage 3) on more "
                              "than one rank");
  }
  self.comm.set_store(store);
  if (store == nullptr) return;
  for (auto& unit : self.units) {
    if (!unit->params.empty() && unit->sharding == sharded_state::sharded) self.comm.shard_out(*unit);
  }
}

std::int64_t fsdp_engine::parameter_shard_bytes() const {
  std::int64_t total = 0;
  for (const auto& unit : impl_->units) total += static_cast<std::int64_t>(unit->shard.storage().nbytes());
  return total;
}

std::vector<at::Tensor> fsdp_engine::held_tensors() const {
  std::vector<at::Tensor> out;
  for (const auto& unit : impl_->units) {
    for (const at::Tensor* t : {&unit->shard, &unit->grad_shard, &unit->reduced, &unit->full, &unit->full_grad}) {
      if (t->defined()) out.push_back(*t);
    }
  }
  return out;
}

std::int64_t fsdp_engine::held_bytes() const {
  std::set<const void*> seen;
  std::int64_t total = 0;
  auto count = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    const void* key = t.storage().unsafeGetStorageImpl();
    if (seen.insert(key).second) total += static_cast<std::int64_t>(t.storage().nbytes());
  };
  for (const auto& unit : impl_->units) {
    count(unit->shard);
    count(unit->grad_shard);
    count(unit->reduced);
    count(unit->full);
    count(unit->full_grad);
  }
  return total;
}

// The strategies' calls (fsdp_engine_calls.hpp).
void root_pre_forward(fsdp_engine& engine) { engine.root_pre_forward(); }
void root_watch_output(fsdp_engine& engine, const at::Tensor& output) { engine.root_watch_output(output); }
void root_post_forward(fsdp_engine& engine) { engine.root_post_forward(); }
bool sync_enabled(const fsdp_engine& engine) noexcept { return engine.sync_enabled(); }
void set_sync_enabled(fsdp_engine& engine, bool enabled) noexcept { engine.set_sync_enabled(enabled); }

}  // namespace loom::detail
