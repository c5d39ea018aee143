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
#include <loom/comm/device_mesh.hpp>
#include <loom/errors.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <loom/strategy/unit.hpp>
#include <loom/strategy/unit_layout.hpp>

#include "../checkpoint/optimizer_state.hpp"
#include "../util/optimizer_families.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <typeindex>
#include <unordered_map>

namespace loom::detail {

namespace {

// A tensor's storage emptied (its bytes returned to the allocator) and
// refilled in place: every view of it stays a view of it.
void free_storage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == 0) return;
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}
void allocate_storage(const at::Tensor& tensor, std::size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == nbytes) return;
  at::Allocator* allocator = storage->allocator();
  if (allocator == nullptr) allocator = c10::GetAllocator(tensor.device().type());
  storage->set_data_ptr_noswap(allocator->allocate(nbytes));
  storage->set_nbytes(nbytes);
}
std::size_t bytes_of(const at::Tensor& flat) { return static_cast<std::size_t>(flat.numel()) * flat.element_size(); }

// A gradient shard setup left without storage (sharded_unit::grad_shard_pending),
// given its storage, zeroed: no gradient has been reduced into it yet.
template <class Unit>
void ensure_grad_shard(Unit& unit) {
  if (!unit.grad_shard_pending) return;
  allocate_storage(unit.grad_shard, bytes_of(unit.grad_shard));
  unit.grad_shard.zero_();
  unit.grad_shard_pending = false;
}

// A tensor over `base`'s storage with a version counter of its own.
at::Tensor alias(const at::Tensor& base, int64_t offset, at::IntArrayRef shape) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    strides[static_cast<std::size_t>(d)] = strides[static_cast<std::size_t>(d + 1)] * shape[static_cast<std::size_t>(d + 1)];
  }
  at::Tensor out = at::empty({0}, base.options());
  out.set_(base.storage(), base.storage_offset() + offset, shape, strides);
  return out;
}

}  // namespace

// One parameter of a unit.
struct unit_parameter {
  at::Tensor param;                  // the user's leaf; its data is re-pointed
  std::vector<std::string> names;    // every dotted name it has (shared parameters have several)
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;                // in the unit's flat buffer
  at::Tensor full_view, grad_view;   // param-shaped, over the gathered buffers
  at::Tensor shard_view, grad_shard_view;  // this rank's slice (1-D; param-shaped when nothing is sharded)
  int64_t local_offset = 0;          // where shard_view starts inside the flat buffer
  std::shared_ptr<torch::autograd::Node> accumulator;
  std::uintptr_t hook_key = 0;
  bool requires_grad = true;
};

struct sharded_unit {
  fsdp_engine::impl* engine = nullptr;
  std::string name;
  torch::nn::Module* module = nullptr;
  unit_marker* marker = nullptr;  // nullptr: the root, or a plain module chosen by auto_wrap_policy
  int index = 0;
  int parent = -1;                // the innermost unit above it
  std::vector<unit_parameter> params;
  int64_t numel = 0, padded = 0, shard_numel = 0;
  int partition = -1;             // its index among the units with parameters (a shard_store's key)
  at::Tensor shard, grad_shard, reduced;  // reduced: a fresh reduction, added when gradients accumulate
  at::Tensor full, full_grad;             // storages emptied between uses (aliases of shard/grad_shard when unsharded)
  comm::work gather;
  bool gather_pending = false;
  bool gathered = false;
  bool views_full = false;        // parameters point at the gathered buffer
  comm::work reduction;
  bool reduction_pending = false;
  bool backward_started = false;
  bool post_backward_done = false;
  bool grads_live = false;        // full_grad holds gradients (accumulating under no_backward_sync)
  // grad_shard's storage comes with the first backward (or partitions()):
  // setup holds no gradient, as torch's FSDP allocates them in backward.
  bool grad_shard_pending = false;
  bool had_grad = false;          // the reduced shard is added to the gradients already there
  int grads_expected = 0;
  int grads_seen = 0;
  int watched_outputs = 0;
  int forward_position = -1;
  bool checkpoint = false;        // activation checkpointing: the forward is recomputed in backward
  at::Tensor low_in, low_out;     // a reduction in reduce_dtype: the gradients converted, and the result
};

struct fsdp_engine::impl {
  fsdp_options options;
  comm::process_group shard_group;      // invalid when the shard group is one rank
  comm::process_group replicate_group;  // invalid when the replicate group is one rank
  int shard_size = 1;
  int shard_rank = 0;
  int replicate_size = 1;
  int global_rank = 0;
  std::vector<std::unique_ptr<sharded_unit>> units;  // [0] is the root
  std::vector<sharded_unit*> forward_order;          // sub-units with a hook, as the last forward ran them
  std::size_t forward_cursor = 0;
  bool sync = true;
  bool backward_active = false;
  // cpu_offload: shards (parameters, gradients, so the optimizer's state)
  // live on the host; each gather moves the parameter shard to the compute
  // device and each reduction moves the gradient shard back. On cpu both
  // moves are the identity (Tensor::to and a copy onto itself are no-ops):
  // the schedule runs and is counted, and nothing is copied.
  bool offload = false;
  c10::Device compute_device{c10::DeviceType::CPU};
  // The dtype gradients are reduced in (nullopt: the parameters').
  std::optional<c10::ScalarType> reduce_dtype;
  std::vector<sharded_unit*> pending_reductions;     // issue order
  fsdp_counters counters;
  // offload_param to NVMe: shards are read from the store for each gather
  // and freed when it completes, unless pinned (a checkpoint holds them).
  shard_store* store = nullptr;
  int pinned = 0;
  int partitions = 0;

  void shard_in(sharded_unit& unit) {
    if (store == nullptr || unit.params.empty() || unit.shard.storage().nbytes() == bytes_of(unit.shard)) return;
    allocate_storage(unit.shard, bytes_of(unit.shard));
    store->load_shard(static_cast<std::size_t>(unit.partition), unit.shard);
  }
  void shard_out(sharded_unit& unit) {
    if (store == nullptr || pinned > 0) return;
    free_storage(unit.shard);
  }

  bool sharded() const noexcept { return shard_size > 1; }
  // ZeRO-1: the full gradient buffer stays; the shard is its own chunk.
  bool keeps_gradients() const noexcept { return sharded() && options.keep_full_gradients; }
  bool frees_after_forward(const sharded_unit& unit) const noexcept {
    return sharded() && unit.marker != nullptr && options.strategy != sharding_strategy::shard_grad_op;
  }

  // ------------------------------------------------------------ gathering
  void issue_gather(sharded_unit& unit, bool prefetch) {
    if (!sharded() || unit.gathered || unit.gather_pending) return;
    allocate_storage(unit.full, bytes_of(unit.full));
    shard_in(unit);
    unit.gather = shard_group.all_gather_into(unit.full, offload ? to_compute_device(unit.shard) : unit.shard);
    unit.gather_pending = true;
    ++counters.all_gathers;
    if (prefetch) ++counters.prefetches;
  }
  at::Tensor to_compute_device(const at::Tensor& host) {
    ++counters.offload_to_device;
    return host.to(compute_device);
  }
  void to_host(at::Tensor& host, const at::Tensor& reduced) {
    ++counters.offload_to_host;
    if (!reduced.is_same(host)) host.copy_(reduced);
  }

  void ensure_gathered(sharded_unit& unit) {
    if (!sharded() || unit.gathered) return;
    issue_gather(unit, false);
    unit.gather.wait();
    unit.gather_pending = false;
    unit.gathered = true;
    shard_out(unit);
  }
  void point_full(sharded_unit& unit) {
    if (unit.views_full) return;
    for (auto& p : unit.params) p.param.set_data(p.full_view);
    unit.views_full = true;
  }
  void point_shard(sharded_unit& unit) {
    if (!unit.views_full) return;
    for (auto& p : unit.params) p.param.set_data(p.shard_view);
    unit.views_full = false;
  }
  // The parameters back to their shards. FULL_SHARD empties the gathered
  // storage; SHARD_GRAD_OP keeps it allocated between steps (ZeRO-2's 4 bytes
  // per parameter: the next step's gather refills it, allocating nothing).
  void release(sharded_unit& unit) {
    point_shard(unit);
    if (!sharded() || !unit.gathered) return;
    if (options.strategy != sharding_strategy::shard_grad_op) free_storage(unit.full);
    unit.gathered = false;
  }

  // ------------------------------------------------------------- forward
  void pre_forward(sharded_unit& unit) {
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
      issue_gather(*forward_order[forward_cursor], true);
    }
  }

  void watch(sharded_unit& unit, const at::Tensor& output) {
    if (!output.defined() || !output.requires_grad()) return;
    ++unit.watched_outputs;
    sharded_unit* target = &unit;
    output.register_hook([target](const at::Tensor&) { target->engine->pre_backward(*target); });
  }

  void post_forward(sharded_unit& unit) {
    point_shard(unit);
    if (frees_after_forward(unit) || unit.watched_outputs == 0) release(unit);
    unit.watched_outputs = 0;
  }

  void root_pre_forward() {
    forward_cursor = 0;
    sharded_unit& root = *units[0];
    // The root and the plain modules auto_wrap_policy chose (no forward of
    // their own to hook) are gathered for the whole forward.
    for (auto& unit : units) {
      if (unit->marker == nullptr) issue_gather(*unit, false);
    }
    for (auto& unit : units) {
      if (unit->marker == nullptr) {
        ensure_gathered(*unit);
        point_full(*unit);
      }
    }
    if (options.forward_prefetch && !forward_order.empty()) issue_gather(*forward_order.front(), true);
    (void)root;
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
  }
  void finish_gather_and_release(sharded_unit& unit) {
    if (unit.gather_pending) {
      unit.gather.wait();
      unit.gather_pending = false;
      unit.gathered = true;
      shard_out(unit);
    }
    release(unit);
  }

  // ------------------------------------------------------------ backward
  void pre_backward(sharded_unit& unit) {
    if (unit.backward_started) return;
    if (!backward_active) {
      backward_active = true;
      torch::autograd::Engine::get_default_engine().queue_callback([this] { end_of_backward(); });
    }
    start_backward(unit);
    if (unit.index == 0) {
      for (auto& other : units) {
        if (other->marker == nullptr && !other->backward_started) start_backward(*other);
      }
    }
    if (options.backward_prefetch && unit.forward_position > 0 &&
        static_cast<std::size_t>(unit.forward_position) <= forward_order.size()) {
      issue_gather(*forward_order[static_cast<std::size_t>(unit.forward_position - 1)], true);
    }
  }

  void start_backward(sharded_unit& unit) {
    unit.backward_started = true;
    unit.post_backward_done = false;
    unit.grads_seen = 0;
    ensure_gathered(unit);
    point_full(unit);
    if (!unit.grads_live) {
      ensure_grad_shard(unit);
      unit.had_grad = false;
      for (auto& p : unit.params) unit.had_grad = unit.had_grad || p.param.grad().defined();
      if (keeps_gradients() && unit.had_grad) {
        // The shard is a chunk of the buffer zeroed below: the gradients
        // there are set aside and added back after the reduction.
        unit.reduced = unit.grad_shard.clone();
        for (auto& p : unit.params) {
          if (!p.param.grad().defined() && p.grad_shard_view.numel() > 0) {
            unit.reduced.narrow(0, p.local_offset - shard_rank * unit.shard_numel, p.grad_shard_view.numel()).zero_();
          }
        }
      }
      if (sharded()) {
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
    for (auto& p : unit.params) {
      if (p.requires_grad) p.param.mutable_grad() = p.grad_view;
    }
  }

  void gradient_ready(sharded_unit& unit) {
    if (!unit.backward_started || unit.post_backward_done) return;
    if (++unit.grads_seen == unit.grads_expected) post_backward(unit);
  }

  void post_backward(sharded_unit& unit) {
    unit.post_backward_done = true;
    if (!sync) {
      // Gradients stay in the full buffer; the next backward adds to it.
      for (auto& p : unit.params) p.param.mutable_grad().reset();
      release(unit);
      return;
    }
    const bool low = reduce_dtype && *reduce_dtype != unit.grad_shard.scalar_type();
    if (sharded()) {
      // A fresh reduction is added to the gradients there (ZeRO-1 set them
      // aside at the start of backward and reduces into its chunk).
      const bool separate = unit.had_grad && !keeps_gradients();
      if (separate) unit.reduced = at::empty_like(unit.grad_shard);
      const at::Tensor& out = separate ? unit.reduced : unit.grad_shard;
      if (low) {
        unit.low_in = unit.full_grad.to(*reduce_dtype);
        unit.low_out = at::empty({unit.shard_numel}, unit.low_in.options());
        unit.reduction = shard_group.reduce_scatter_into(unit.low_out, unit.low_in, reduce_op::mean);
      } else {
        unit.reduction = shard_group.reduce_scatter_into(out, unit.full_grad, reduce_op::mean);
      }
      ++counters.reduce_scatters;
    } else {
      if (low) {
        unit.low_out = unit.grad_shard.to(*reduce_dtype);
        unit.reduction = replicate_group.all_reduce_async(unit.low_out, reduce_op::mean);
      } else {
        unit.reduction = replicate_group.all_reduce_async(unit.grad_shard, reduce_op::mean);
      }
      ++counters.all_reduces;
    }
    unit.reduction_pending = true;
    release(unit);
    // One reduction stays in flight behind this unit's backward; the older
    // ones are finished now, so their full gradient buffers are freed.
    for (sharded_unit* earlier : pending_reductions) finish_reduction(*earlier);
    pending_reductions.clear();
    pending_reductions.push_back(&unit);
  }

  void finish_reduction(sharded_unit& unit) {
    if (!unit.reduction_pending) return;
    unit.reduction.wait();
    unit.reduction_pending = false;
    if (unit.low_out.defined()) {
      // Reduced in reduce_dtype: back into the gradients' dtype.
      at::Tensor target = sharded() && unit.had_grad && !keeps_gradients() ? unit.reduced : unit.grad_shard;
      target.copy_(unit.low_out);
      unit.low_in = at::Tensor();
      unit.low_out = at::Tensor();
    }
    if (sharded()) {
      const at::Tensor& fresh = unit.had_grad && !keeps_gradients() ? unit.reduced : unit.grad_shard;
      if (replicate_group.valid()) {
        at::Tensor across = fresh;
        replicate_group.all_reduce(across, reduce_op::mean);
        ++counters.all_reduces;
      }
      if (unit.had_grad) unit.grad_shard.add_(unit.reduced);
      unit.reduced = at::Tensor();
      if (!keeps_gradients()) free_storage(unit.full_grad);
    }
    if (offload) to_host(unit.grad_shard, unit.grad_shard);
    unit.grads_live = false;
    for (auto& p : unit.params) {
      if (p.requires_grad) p.param.mutable_grad() = p.grad_shard_view;
    }
  }

  void end_of_backward() {
    for (auto& unit : units) {
      if (unit->backward_started && !unit->post_backward_done) post_backward(*unit);
    }
    for (sharded_unit* unit : pending_reductions) finish_reduction(*unit);
    pending_reductions.clear();
    for (auto& unit : units) {
      finish_gather_and_release(*unit);
      unit->backward_started = false;
      unit->post_backward_done = false;
    }
    shard_group.release_buffers();
    replicate_group.release_buffers();
    backward_active = false;
  }
};

// ---------------------------------------------------------------- hooks
void unit_pre_forward(sharded_unit& unit) { unit.engine->pre_forward(unit); }
void unit_watch_output(sharded_unit& unit, const at::Tensor& output) { unit.engine->watch(unit, output); }
void unit_post_forward(sharded_unit& unit) { unit.engine->post_forward(unit); }
bool unit_checkpoints(const sharded_unit& unit) { return unit.checkpoint; }

namespace {

// AccumulateGrad's post hook: one parameter's gradient is in the buffer.
class gradient_ready_hook final : public torch::autograd::FunctionPostHook {
 public:
  explicit gradient_ready_hook(sharded_unit* unit) : unit_(unit) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    unit_->engine->gradient_ready(*unit_);
    return outputs;
  }

 private:
  sharded_unit* unit_;
};

// The shard a unit's sharded construction left, when the engine lays the
// unit out as it was cut (FULL_SHARD or HYBRID_SHARD over the same shards,
// this rank's); otherwise the unit is gathered whole now, each parameter
// keeps the part this rank holds (gather_constructed), and setup shards it
// as if it had been built whole: null then, as for a unit built whole.
// Throws configuration_error where the parameters are not the ones it was
// cut from, or were converted to another dtype in between.
const constructed_shard* adopted_shard(const sharded_unit& unit, const fsdp_options& options, int shard, int rank) {
  const constructed_shard* built = unit.marker != nullptr ? unit.marker->constructed() : nullptr;
  if (built == nullptr) return nullptr;
  const std::string refusal = "fsdp: unit " + unit.name + " was sharded as it was built (init_module(true)), but ";
  const std::string remedy = "; build the model outside init_module(true) (each rank then holds it whole until setup)";
  bool same = built->parameters.size() == unit.params.size();
  for (std::size_t i = 0; same && i < unit.params.size(); ++i) {
    same = built->parameters[i] == unit.params[i].param.unsafeGetTensorImpl();
  }
  if (!same) {
    throw configuration_error(refusal + "its parameters at setup are not the ones it was cut from (a weight tied "
                              "to another unit, parameters added after its constructor, or a wrap policy that "
                              "makes units inside it)" + remedy);
  }
  if (!unit.params.empty() && built->shard.scalar_type() != unit.params.front().param.scalar_type()) {
    throw configuration_error(refusal + "in " + std::string(c10::toString(built->shard.scalar_type())) +
                              ", and its parameters are " +
                              std::string(c10::toString(unit.params.front().param.scalar_type())) +
                              " at setup (converted in between)" + remedy);
  }
  const bool cut_alike =
      (options.strategy == sharding_strategy::full_shard || options.strategy == sharding_strategy::hybrid_shard) &&
      built->shards == shard && built->rank == rank && built->numel == unit.numel;
  if (cut_alike) return built;
  std::vector<at::Tensor> parameters;
  for (const auto& p : unit.params) parameters.push_back(p.param);
  gather_constructed(*unit.marker, parameters);
  return nullptr;
}

struct module_entry {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;
  int parent_module = -1;  // index in the list
  int unit = -1;           // the unit it starts, or -1
};

std::string parent_name(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

std::string shown_unit(const std::string& name) { return name.empty() ? std::string("<root>") : name; }

}  // namespace

// ------------------------------------------------------------------ setup
fsdp_engine::fsdp_engine(torch::nn::Module& module, comm::process_group& world, const fsdp_options& options,
                         int ranks_per_node, std::string_view precision)
    : impl_(std::make_unique<impl>()) {
  impl& self = *impl_;
  self.options = options;
  // Lightning's mapping (FSDPPrecision.mixed_precision_config), overridden
  // field by field by the mixed_precision option.
  if (precision == "bf16-mixed") self.reduce_dtype = at::kBFloat16;
  if (options.mixed_precision) {
    const fsdp_mixed_precision& mixed = *options.mixed_precision;
    if (mixed.reduce_dtype) self.reduce_dtype = mixed.reduce_dtype;
    for (const auto& p : module.parameters()) {
      if (mixed.param_dtype && *mixed.param_dtype != p.scalar_type()) {
        throw configuration_error(
            std::string("fsdp: mixed_precision.param_dtype = ") + c10::toString(*mixed.param_dtype) +
            ", but the parameters are " + c10::toString(p.scalar_type()) + " (under precision " +
            std::string(precision) + "); gathering in another dtype than the parameters' is not built yet: leave "
            "param_dtype unset, or choose the precision that gives the parameters that dtype (bf16-true)");
      }
    }
    if (mixed.buffer_dtype) {
      at::NoGradGuard no_grad;
      for (auto& buffer : module.buffers()) {
        if (buffer.is_floating_point()) buffer.set_data(buffer.to(*mixed.buffer_dtype));
      }
    }
  }
  const int world_size = world.size();
  const int rank = world.rank();
  if (options.keep_full_gradients && options.strategy != sharding_strategy::shard_grad_op) {
    throw configuration_error("fsdp: keep_full_gradients (ZeRO stage 1) needs sharding_strategy SHARD_GRAD_OP, not " +
                              std::string(to_string(options.strategy)));
  }

  // The mesh: (replicate, shard).
  int replicate = 1;
  int shard = world_size;
  switch (options.strategy) {
    case sharding_strategy::full_shard:
    case sharding_strategy::shard_grad_op: break;
    case sharding_strategy::no_shard:
      replicate = world_size;
      shard = 1;
      break;
    case sharding_strategy::hybrid_shard:
      if (options.device_mesh) {
        replicate = options.device_mesh->first;
        shard = options.device_mesh->second;
      } else {
        shard = std::max(1, ranks_per_node);
        replicate = world_size / shard;
      }
      if (replicate < 1 || shard < 1 || replicate * shard != world_size) {
        throw configuration_error("fsdp: HYBRID_SHARD's device_mesh (replicate=" + std::to_string(replicate) +
                                  ", shard=" + std::to_string(shard) + ") must multiply to the world size " +
                                  std::to_string(world_size) + " (Lightning's device_mesh=(replicate, shard))");
      }
      break;
  }
  if (options.device_mesh && options.strategy != sharding_strategy::hybrid_shard) {
    throw configuration_error("fsdp: device_mesh applies to HYBRID_SHARD only; sharding_strategy is " +
                              std::string(to_string(options.strategy)));
  }
  // The engine's own groups (its traffic never interleaves with the user's
  // collectives), formed as every other mesh is.
  comm::device_mesh mesh(world, {replicate, shard}, {"replicate", "shard"});
  self.shard_size = shard;
  self.replicate_size = replicate;
  self.shard_rank = mesh.coordinate("shard");
  self.global_rank = rank;
  self.shard_group = mesh.group("shard");
  self.replicate_group = mesh.group("replicate");

  // Units: the root, every loom::unit<M>, and what auto_wrap_policy chooses.
  std::vector<module_entry> modules;
  std::map<std::string, int> index_of;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    module_entry entry{item.key(), item.value()};
    if (!entry.name.empty()) entry.parent_module = index_of.at(parent_name(entry.name));
    index_of[entry.name] = static_cast<int>(modules.size());
    modules.push_back(std::move(entry));
  }
  // Parameters not yet in a unit below, bottom-up (for the size and predicate policies).
  std::vector<int64_t> unwrapped(modules.size(), 0);
  std::vector<bool> is_unit(modules.size(), false);
  is_unit[0] = true;
  const auto& policy = options.wrap_policy;
  for (std::size_t i = modules.size(); i-- > 0;) {
    for (const auto& p : modules[i].module->parameters(/*recurse=*/false)) unwrapped[i] += p.numel();
    auto* marker = dynamic_cast<unit_marker*>(modules[i].module.get());
    bool chosen = marker != nullptr;
    if (i > 0 && !chosen && !policy.empty()) {
      const torch::nn::Module& m = *modules[i].module;
      const std::string class_name = m.name();
      const std::string short_name = class_name.rfind("torch::nn::", 0) == 0 && class_name.size() > 15 &&
                                             class_name.compare(class_name.size() - 4, 4, "Impl") == 0
                                         ? class_name.substr(11, class_name.size() - 15)
                                         : class_name;
      chosen = policy.module_types.count(std::type_index(typeid(m))) > 0 ||
               policy.module_names.count(class_name) > 0 || policy.module_names.count(short_name) > 0 ||
               (policy.min_num_params > 0 && unwrapped[i] >= policy.min_num_params) ||
               (policy.predicate && policy.predicate(m, modules[i].name, unwrapped[i]));
    }
    if (i > 0 && chosen) is_unit[i] = true;
    if (i > 0 && !is_unit[i]) unwrapped[static_cast<std::size_t>(modules[i].parent_module)] += unwrapped[i];
  }
  auto innermost_unit_module = [&](int m) {
    while (!is_unit[static_cast<std::size_t>(m)]) m = modules[static_cast<std::size_t>(m)].parent_module;
    return m;
  };
  for (std::size_t i = 0; i < modules.size(); ++i) {
    if (!is_unit[i]) continue;
    auto unit = std::make_unique<sharded_unit>();
    unit->engine = &self;
    unit->name = modules[i].name;
    unit->module = modules[i].module.get();
    unit->marker = i == 0 ? nullptr : dynamic_cast<unit_marker*>(modules[i].module.get());
    unit->index = static_cast<int>(self.units.size());
    if (i > 0) unit->parent = modules[static_cast<std::size_t>(innermost_unit_module(modules[i].parent_module))].unit;
    // Lightning's activation_checkpointing_policy (module types), or the holder's own flag.
    const torch::nn::Module& m = *modules[i].module;
    const bool asked = options.activation_checkpointing_types.count(std::type_index(typeid(m))) > 0 ||
                       (unit->marker != nullptr && unit->marker->checkpoints_activations());
    if (asked && (unit->marker == nullptr || !unit->marker->can_checkpoint())) {
      throw configuration_error(
          "fsdp: activation checkpointing of '" + shown_unit(modules[i].name) + "' (" + m.name() +
          ") needs a loom::unit<M> holder whose forward takes tensors and returns one (its forward is "
          "recomputed in backward from its inputs); declare it as a unit, or leave it out of the policy");
    }
    unit->checkpoint = asked;
    modules[i].unit = unit->index;
    self.units.push_back(std::move(unit));
  }

  // Each parameter once, in the innermost unit that contains every module
  // registering it (the root at worst).
  struct owner {
    at::Tensor param;
    std::vector<std::string> names;
    std::vector<int> units;
  };
  std::vector<owner> owners;
  std::unordered_map<const void*, std::size_t> owner_of;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const int unit = modules[static_cast<std::size_t>(innermost_unit_module(static_cast<int>(i)))].unit;
    for (const auto& item : modules[i].module->named_parameters(/*recurse=*/false)) {
      const std::string name = modules[i].name.empty() ? item.key() : modules[i].name + "." + item.key();
      const void* key = item.value().unsafeGetTensorImpl();
      auto found = owner_of.find(key);
      if (found == owner_of.end()) {
        owner_of.emplace(key, owners.size());
        owners.push_back(owner{item.value(), {name}, {unit}});
      } else {
        owners[found->second].names.push_back(name);
        owners[found->second].units.push_back(unit);
      }
    }
  }
  auto ancestors = [&](int unit) {
    std::vector<int> chain;
    for (; unit >= 0; unit = self.units[static_cast<std::size_t>(unit)]->parent) chain.push_back(unit);
    return chain;
  };
  std::vector<std::vector<const owner*>> members(self.units.size());
  for (const auto& o : owners) {
    int chosen = o.units.front();
    for (int other : o.units) {
      const auto chain = ancestors(other);
      while (std::find(chain.begin(), chain.end(), chosen) == chain.end()) {
        chosen = self.units[static_cast<std::size_t>(chosen)]->parent;
      }
    }
    const bool spans_units =
        std::any_of(o.units.begin(), o.units.end(), [&](int u) { return u != o.units.front(); });
    if (spans_units && rank == 0) {
      std::string list;
      std::set<int> seen;
      for (std::size_t k = 0; k < o.units.size(); ++k) {
        if (!seen.insert(o.units[k]).second) continue;
        list += (list.empty() ? "" : ", ") + shown_unit(self.units[static_cast<std::size_t>(o.units[k])]->name);
      }
      std::cerr << "loom fsdp: parameter '" << o.names.front() << "' (also '" << o.names.back()
                << "') is used by the units " << list << "; it is flattened once, into "
                << shown_unit(self.units[static_cast<std::size_t>(chosen)]->name)
                << ", the innermost unit that contains them all\n";
    }
    members[static_cast<std::size_t>(chosen)].push_back(&o);
  }

  self.offload = options.cpu_offload;
  for (const auto& p : module.parameters()) {
    self.compute_device = p.device();
    break;
  }
  if (options.cpu_offload) {
    for (const auto& p : module.parameters()) {
      if (!p.device().is_cpu()) {
        throw configuration_error("fsdp: cpu_offload (fsdp_cpu_offload) keeps the shards on the CPU between uses; "
                                  "on " + p.device().str() + " that move is not built yet. On cpu it is the "
                                  "identity: use accelerator cpu, or fsdp without offload");
      }
    }
  }
  // Flat buffers: gathered from rank 0's values (sync_module_states), each
  // rank keeping its shard; the parameters re-pointed at their slices.
  at::NoGradGuard no_grad;
  for (auto& unit_pointer : self.units) {
    sharded_unit& unit = *unit_pointer;
    const auto& list = members[static_cast<std::size_t>(unit.index)];
    for (const owner* o : list) {
      unit_parameter p;
      p.param = o->param;
      p.names = o->names;
      p.shape = o->param.sizes().vec();
      p.numel = o->param.numel();
      p.offset = unit.numel;
      p.requires_grad = o->param.requires_grad();
      unit.numel += p.numel;
      if (!unit.params.empty() && (p.param.scalar_type() != unit.params.front().param.scalar_type() ||
                                   p.param.device() != unit.params.front().param.device())) {
        throw configuration_error("fsdp: unit " + shown_unit(unit.name) + " mixes parameters of dtype/device " +
                                  std::string(c10::toString(unit.params.front().param.scalar_type())) + " and " +
                                  std::string(c10::toString(p.param.scalar_type())) + " ('" + p.names.front() +
                                  "'); a unit's flat buffer has one dtype: wrap them in separate units");
      }
      unit.params.push_back(std::move(p));
    }
    const flat_shard layout{unit.numel, shard, self.shard_rank};
    unit.padded = layout.padded();
    unit.shard_numel = layout.shard_numel();
    if (!unit.params.empty()) unit.partition = self.partitions++;
    // Sharded at construction: the shard is there, the parameters are
    // placeholders, and the flat buffer only gives their views a storage.
    const constructed_shard* built = adopted_shard(unit, options, shard, self.shard_rank);
    if (unit.params.empty()) {
      unit.shard = at::empty({0});
      unit.full = unit.grad_shard = unit.full_grad = unit.reduced = unit.shard;
      continue;
    }
    const auto options_of = unit.params.front().param.options().requires_grad(false);
    const int64_t shard_begin = layout.begin();
    // Each parameter's view of a shard-sized buffer (the gradient shard).
    auto cut_shard_views = [&](const at::Tensor& buffer) {
      for (auto& p : unit.params) {
        const auto [begin, end] = layout.part(p.offset, p.numel);
        p.grad_shard_view = buffer.narrow(0, begin - shard_begin, end - begin);
      }
    };
    if (shard > 1) {
      // The gradient shard's storage waits for the first backward; made, its
      // views cut, and emptied before the flat buffer exists, so setup's peak
      // never holds both.
      unit.grad_shard = at::empty({unit.shard_numel}, options_of);
      cut_shard_views(unit.grad_shard);
      free_storage(unit.grad_shard);
      unit.grad_shard_pending = true;
    }
    at::Tensor flat = built != nullptr ? at::empty({unit.padded}, options_of) : at::zeros({unit.padded}, options_of);
    if (built == nullptr) {
      for (auto& p : unit.params) flat.narrow(0, p.offset, p.numel).copy_(p.param.detach().reshape({-1}));
      if (options.sync_module_states && world.valid()) world.broadcast(flat, 0);
    }
    const bool keeps_full = options.strategy == sharding_strategy::shard_grad_op;
    if (shard > 1) {
      unit.full = flat;
      // SHARD_GRAD_OP (ZeRO-2) keeps the whole flat buffer: its shard is its
      // own chunk, which the optimizer updates in place, and the gather
      // before the next forward fills the other chunks (4Ψ + 12Ψ/N).
      unit.shard = flat.narrow(0, shard_begin, unit.shard_numel);
      if (built != nullptr) unit.shard = built->shard;
      else if (!keeps_full) unit.shard = unit.shard.clone();
      if (unit.marker != nullptr) unit.marker->set_constructed(nullptr);
    } else {
      unit.shard = unit.full = flat;
      unit.grad_shard = unit.full_grad = at::zeros({unit.padded}, options_of);
    }
    for (auto& p : unit.params) {
      p.full_view = alias(unit.full, p.offset, p.shape);
      if (shard > 1) {
        const auto [begin, end] = layout.part(p.offset, p.numel);
        p.local_offset = begin;
        p.shard_view = unit.shard.narrow(0, begin - shard_begin, end - begin);
      } else {
        p.local_offset = p.offset;
        p.shard_view = p.full_view;  // nothing sharded: the parameter keeps its shape
      }
      // AccumulateGrad is made while the parameter is full-sized (autograd
      // checks incoming gradients against its shape) and kept alive here.
      p.param.set_data(p.full_view);
      p.param.mutable_grad().reset();
      if (p.requires_grad) {
        p.accumulator = torch::autograd::impl::grad_accumulator(p.param);
        p.hook_key = p.accumulator->add_post_hook(std::make_unique<gradient_ready_hook>(&unit));
        ++unit.grads_expected;
      }
      p.param.set_data(p.shard_view);  // the module's own copy of these parameters goes now
    }
    if (shard > 1) {
      // The gradient buffer's views are made while no other unit-sized buffer
      // is allocated: setup's peak is the model, one unit, and the shards.
      if (!keeps_full) free_storage(unit.full);
      unit.full_grad = at::empty({unit.padded}, options_of);
      for (auto& p : unit.params) p.grad_view = alias(unit.full_grad, p.offset, p.shape);
      if (self.keeps_gradients()) {
        // ZeRO-1: the reduced shard is the buffer's own chunk.
        unit.full_grad.zero_();
        unit.grad_shard = unit.full_grad.narrow(0, shard_begin, unit.shard_numel);
        unit.grad_shard_pending = false;
        cut_shard_views(unit.grad_shard);
      } else {
        free_storage(unit.full_grad);
      }
    } else {
      for (auto& p : unit.params) p.grad_view = alias(unit.full_grad, p.offset, p.shape);
      for (auto& p : unit.params) p.grad_shard_view = p.grad_view;
      unit.gathered = true;
    }
    if (unit.marker != nullptr) unit.marker->attach(&unit);
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
const fsdp_counters& fsdp_engine::counters() const noexcept { return impl_->counters; }
int fsdp_engine::shard_size() const noexcept { return impl_->shard_size; }
int fsdp_engine::replicate_size() const noexcept { return impl_->replicate_size; }
bool fsdp_engine::cpu_offload() const noexcept { return impl_->offload; }

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
    const bool was_gathered = unit->gathered;
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
      if (self.sharded()) {
        where.offset = p.offset;
        where.stride = unit->shard_numel;
        where.slice_group = self.shard_group;
      }
      if (self.replicate_group.valid()) where.replicated_over.push_back(self.replicate_group);
      out.push_back(std::move(where));
    }
  }
  return out;
}

const torch::nn::Module& fsdp_engine::module() const { return *impl_->units.front()->module; }

void fsdp_engine::after_full_state(bool changed) {
  for (auto& unit : impl_->units) unit->views_full = false;
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
  if (self.store == nullptr) return;
  ++self.pinned;
  for (auto& unit : self.units) self.shard_in(*unit);
}

void fsdp_engine::unpin_shards(bool changed) {
  impl& self = *impl_;
  if (self.store == nullptr) return;
  --self.pinned;
  for (auto& unit : self.units) {
    if (unit->params.empty()) continue;
    if (changed) self.store->store_shard(static_cast<std::size_t>(unit->partition), unit->shard);
    if (!unit->gathered && !unit->gather_pending) self.shard_out(*unit);
  }
}

void fsdp_engine::set_shard_store(shard_store* store) {
  impl& self = *impl_;
  if (store != nullptr && (!self.sharded() || self.options.strategy != sharding_strategy::full_shard)) {
    throw configuration_error("fsdp: parameter shards kept outside memory need FULL_SHARD (ZeRO stage 3) on more "
                              "than one rank");
  }
  self.store = store;
  if (store == nullptr) return;
  for (auto& unit : self.units) {
    if (!unit->params.empty() && !unit->gathered && !unit->gather_pending) self.shard_out(*unit);
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

}  // namespace loom::detail
