// FSDPStrategy's options under Lightning's names (and the torch enums they
// take), for loom::fsdp. Units are chosen by loom::unit<M> holders the model
// declares and by auto_wrap_policy; see docs/fsdp.md.
#pragma once

#include <loom/strategy/process_options.hpp>
#include <loom/util/held_module.hpp>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeindex>
#include <utility>

namespace torch::nn {
class Module;
}

namespace loom {

// torch.distributed.fsdp.ShardingStrategy.
enum class sharding_strategy {
  full_shard,     // parameters, gradients, optimizer state sharded; parameters freed after each unit's forward (ZeRO-3)
  shard_grad_op,  // gradients and optimizer state sharded; parameters gathered once per step, freed after backward (ZeRO-2)
  no_shard,       // nothing sharded: gradients all-reduced (DDP's semantics)
  hybrid_shard,   // full_shard inside a node, replicated across nodes (device_mesh = (replicate, shard))
};

constexpr std::string_view to_string(sharding_strategy strategy) noexcept {
  switch (strategy) {
    case sharding_strategy::full_shard: return "FULL_SHARD";
    case sharding_strategy::shard_grad_op: return "SHARD_GRAD_OP";
    case sharding_strategy::no_shard: return "NO_SHARD";
    case sharding_strategy::hybrid_shard: return "HYBRID_SHARD";
  }
  return "?";
}

// Lightning's auto_wrap_policy: which submodules become units at setup, in
// addition to the loom::unit<M> holders the model declares. A set of module
// types (Lightning's "set of layer classes"), a minimum parameter count
// (torch's size_based_auto_wrap_policy), or any predicate on (module, its
// dotted name, its parameter count not yet in a unit below it).
struct auto_wrap_policy {
  std::set<std::type_index> module_types;
  // The same by name, for the run-time options: a module's LibTorch class
  // name (Module::name(), "torch::nn::LinearImpl") or its short form ("Linear").
  std::set<std::string> module_names;
  std::int64_t min_num_params = 0;  // 0: off
  std::function<bool(const torch::nn::Module&, std::string_view name, std::int64_t unwrapped_params)> predicate;

  // types<torch::nn::Linear>() (what a Lightning user writes for {nn.Linear})
  // and types<torch::nn::LinearImpl>() name the same modules: a holder
  // stands for the module it holds, which is what setup finds.
  template <class... Modules>
  static auto_wrap_policy types() {
    static_assert((std::is_base_of_v<torch::nn::Module, held_module_t<Modules>> && ...),
                  "auto_wrap_policy::types<M...>(): each M must be a module class (torch::nn::LinearImpl) or its "
                  "holder (torch::nn::Linear)");
    return auto_wrap_policy{.module_types = {std::type_index(typeid(held_module_t<Modules>))...}};
  }
  static auto_wrap_policy size_based(std::int64_t min_num_params) {
    return auto_wrap_policy{.min_num_params = min_num_params};
  }
  bool empty() const noexcept {
    return module_types.empty() && module_names.empty() && min_num_params <= 0 && !predicate;
  }
};

// Lightning's state_dict_type: what fabric.save writes.
enum class state_dict_type {
  sharded,  // a directory: one file per rank with its shards, and meta.pt (Lightning's default)
  full,     // one file, gathered by rank 0: loads into single_device, ddp or fsdp of any size
};

// Lightning's mixed_precision= (torch's MixedPrecision). Unset fields follow
// the Fabric's precision as Lightning maps it (FSDPPrecision.
// mixed_precision_config): bf16-mixed reduces gradients in bf16 (parameters
// fp32, computed under bf16 autocast); bf16-true and 32-true keep the
// parameters' dtype throughout.
struct fsdp_mixed_precision {
  // Gathering in another dtype than the parameters' is not built yet: when
  // set, it must equal the parameters' dtype.
  std::optional<c10::ScalarType> param_dtype;
  // The dtype gradients are reduced in (bf16 halves the bytes; on Gloo it
  // travels as float16 bits and is summed in fp32, rounded once).
  std::optional<c10::ScalarType> reduce_dtype;
  // Buffers (batch-norm statistics) converted at setup.
  std::optional<c10::ScalarType> buffer_dtype;
};

struct fsdp_options {
  sharding_strategy strategy = sharding_strategy::full_shard;  // Lightning: sharding_strategy="FULL_SHARD"
  auto_wrap_policy wrap_policy;                                // Lightning: auto_wrap_policy
  // Lightning: activation_checkpointing_policy (a set of layer classes): those
  // units run their forward without keeping activations and recompute it in
  // backward. A loom::unit<M> can also ask for it itself.
  std::set<std::type_index> activation_checkpointing_types;
  // Lightning: device_mesh=(replicate, shard) for HYBRID_SHARD; the product
  // must be the world size. Unset: (number of nodes, devices per node).
  std::optional<std::pair<int, int>> device_mesh;
  // The next unit's all-gather is issued while the current one computes.
  bool forward_prefetch = true;   // torch: forward_prefetch
  bool backward_prefetch = true;  // torch: backward_prefetch=BACKWARD_PRE
  loom::state_dict_type state_dict = state_dict_type::sharded;  // Lightning: state_dict_type
  // Lightning: cpu_offload (fsdp_cpu_offload is this with true).
  bool cpu_offload = false;
  // Parameters and buffers are made equal to rank 0's at setup (torch:
  // sync_module_states), as DDP does.
  bool sync_module_states = true;
  std::optional<fsdp_mixed_precision> mixed_precision;  // Lightning: mixed_precision
  // ZeRO stage 1 (loom::deepspeed sets it; not an FSDP option): with
  // SHARD_GRAD_OP, each unit's gradients live in a full-sized buffer kept
  // across steps, the rank's reduced shard being its own chunk of it, so
  // only the optimizer state is sharded (8 + 8/N bytes per fp32 parameter).
  bool keep_full_gradients = false;
  // The processes it runs on (timeout, backend, launcher, MPI communicator,
  // watchdog), as every distributed strategy takes them.
  process_options process;
};

}  // namespace loom
