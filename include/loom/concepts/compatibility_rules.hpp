// Which Accelerator x Strategy x Precision combinations can run, as rules
// over a few facts of each policy. Written once, read twice: Fabric takes the
// facts from the types (compatibility.hpp: a static_assert per rule), the
// connector from its name tables (the same sentence as a configuration_error).
// Torch-free, so loom-run checks its flags with it before starting anything.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

// Each rule's sentence, as a literal: C++20's static_assert takes only
// literals, so the table below and compatibility.hpp's static_asserts both
// spell them through these names.
#define LOOM_RULE_FP16_TRUE_WITHOUT_KERNELS                                                                         \
  "16-true cannot run on this accelerator: LibTorch 1.13 has no fp16 matmul kernels on CPU. Use bf16-true "        \
  "(loom::bf16) or bf16-mixed (loom::bf16_mixed) on cpu, or cuda for 16-true."
#define LOOM_RULE_FP16_AUTOCAST_WITHOUT_KERNELS                                                                     \
  "16-mixed cannot run on this accelerator: LibTorch 1.13 refuses fp16 autocast on CPU. Use bf16-mixed "           \
  "(loom::bf16_mixed) on cpu, or cuda for 16-mixed."
#define LOOM_RULE_STRATEGY_NOT_ON_ACCELERATOR                                                                       \
  "the strategy does not run on this accelerator's device type (its `runs_on` trait does not list it). Choose "     \
  "another accelerator or strategy."
#define LOOM_RULE_DP_ON_CPU                                                                                         \
  "dp (DataParallel) drives several devices from one process and runs on cuda only; on cpu Lightning falls back "  \
  "to ddp with a warning, as loom's string path (make_fabric, loom-run) does. Use loom::ddp with loom::cpu."
#define LOOM_RULE_SHARDED_PRECISION                                                                         \
  "a sharded strategy (fsdp, deepspeed, model_parallel) takes 32-true, bf16-true and bf16-mixed (16-true on cuda): 64-true is "  \
  "not among Lightning's FSDP precisions, and under 16-mixed only deepspeed scales the loss itself (FSDP would "   \
  "need a gradient scaler whose inf check is reduced over the shards, which loom does not have yet). Use "        \
  "bf16-mixed (loom::bf16_mixed) or 32-true (loom::fp32)."
#define LOOM_RULE_ONE_PROCESS                                                                                       \
  "the strategy runs one process on one device, but more were asked for. Use devices=1, or a distributed "          \
  "strategy such as loom::ddp."

namespace loom::rules {

// The device types loom's accelerators compute on (an accelerator's
// c10::DeviceType, read by compatibility.hpp's device_type_of), and the set a
// strategy supports (static constexpr rules::device_types runs_on; all unless
// it says).
enum class device_type : std::uint8_t { cpu, cuda };

class device_types {
 public:
  constexpr device_types() = default;  // none
  constexpr device_types(std::initializer_list<device_type> types) {
    for (device_type type : types) bits_ |= bit(type);
  }
  static constexpr device_types all() { return {device_type::cpu, device_type::cuda}; }
  constexpr bool contains(device_type type) const noexcept { return (bits_ & bit(type)) != 0; }
  friend constexpr bool operator==(device_types, device_types) = default;

 private:
  static constexpr std::uint32_t bit(device_type type) { return std::uint32_t{1} << static_cast<unsigned>(type); }
  std::uint32_t bits_ = 0;
};

// What the rules read of each policy.
struct accelerator_facts {
  std::string_view name;
  device_type device = device_type::cpu;
  bool fp16_compute = true;  // fp16 matmul and fp16 autocast have kernels
};
struct precision_facts {
  std::string_view name;
  bool fp16 = false;   // computes in float16 (16-true, 16-mixed)
  bool mixed = false;  // autocast over fp32 weights
  bool fp64 = false;   // 64-true
};
struct strategy_facts {
  std::string_view name;
  bool multi_process = false;  // more than one process (else: one process, one device)
  device_types devices = device_types::all();
  bool sharded = false;  // gradients live in shards (fsdp, deepspeed)
  bool scales_own_loss = false;  // scales the loss itself under 16-mixed (deepspeed)
};

enum class rule {
  none,
  fp16_true_without_kernels,
  fp16_autocast_without_kernels,
  strategy_not_on_accelerator,
  dp_on_cpu,
  sharded_precision,
  one_process,
};

struct rule_reason {
  rule id;
  std::string_view sentence;
};

// The one table of reasons.
inline constexpr rule_reason reasons[] = {
    {rule::fp16_true_without_kernels, LOOM_RULE_FP16_TRUE_WITHOUT_KERNELS},
    {rule::fp16_autocast_without_kernels, LOOM_RULE_FP16_AUTOCAST_WITHOUT_KERNELS},
    {rule::strategy_not_on_accelerator, LOOM_RULE_STRATEGY_NOT_ON_ACCELERATOR},
    {rule::dp_on_cpu, LOOM_RULE_DP_ON_CPU},
    {rule::sharded_precision, LOOM_RULE_SHARDED_PRECISION},
    {rule::one_process, LOOM_RULE_ONE_PROCESS},
};

constexpr std::string_view reason(rule id) {
  for (const auto& entry : reasons) {
    if (entry.id == id) return entry.sentence;
  }
  return {};
}

// The first rule the combination breaks, or rule::none.
constexpr rule first_broken(const accelerator_facts& accelerator, const strategy_facts& strategy,
                            const precision_facts& precision) {
  if (accelerator.device == device_type::cpu && strategy.name == "dp") return rule::dp_on_cpu;
  if (!strategy.devices.contains(accelerator.device)) return rule::strategy_not_on_accelerator;
  if (strategy.sharded && (precision.fp64 || (precision.fp16 && precision.mixed && !strategy.scales_own_loss))) {
    return rule::sharded_precision;
  }
  if (precision.fp16 && !precision.mixed && !accelerator.fp16_compute) return rule::fp16_true_without_kernels;
  if (precision.fp16 && precision.mixed && !accelerator.fp16_compute) return rule::fp16_autocast_without_kernels;
  return rule::none;
}

// The process count a strategy can take (the devices side of the same question).
constexpr rule processes_fit(const strategy_facts& strategy, int processes_per_node, int num_nodes) {
  return !strategy.multi_process && (processes_per_node > 1 || num_nodes > 1) ? rule::one_process : rule::none;
}

// The built-in accelerators' and precisions' facts by name (the connector's
// side); an accelerator loom does not build (mps, tpu) has the host's.
constexpr accelerator_facts builtin_accelerator(std::string_view name) {
#define LOOM_ACCELERATOR(type, device_, fp16_compute_)                                   \
  if (name == #type) return {.name = name, .device = device_type::device_, .fp16_compute = fp16_compute_};
#include <loom/builtin_accelerators.def>
#undef LOOM_ACCELERATOR
  return {.name = name, .device = device_type::cpu, .fp16_compute = false};
}
constexpr precision_facts builtin_precision(std::string_view canonical_name) {
  return {.name = canonical_name,
          .fp16 = canonical_name == "16-true" || canonical_name == "16-mixed",
          .mixed = canonical_name == "16-mixed" || canonical_name == "bf16-mixed",
          .fp64 = canonical_name == "64-true"};
}

}  // namespace loom::rules
