// Each case_* function must fail to compile with the sentence that
// policies.expect gives for it. Built with -fsyntax-only by check.sh.
#include <loom/loom.hpp>

namespace {
struct untagged {};
struct accelerator_without_parse {
  using loom_concept = loom::accelerator_tag;
  static constexpr std::string_view name = "npu";
  static constexpr c10::DeviceType device_type = c10::DeviceType::CPU;
  static bool is_available() { return true; }
  static int device_count() { return 1; }
};
struct strategy_tag_only {
  using loom_concept = loom::strategy_tag;
  static constexpr std::string_view name = "bare";
};
struct cuda_only_strategy : loom::strategy_base {
  static constexpr std::string_view name = "cuda-only";
  static constexpr loom::rules::device_types runs_on = {loom::rules::device_type::cuda};
};
struct precision_without_dtypes : loom::precision_base {
  static constexpr std::string_view name = "nameless-dtype";
};
}  // namespace

void case_cpu_fp16() { loom::Fabric<loom::cpu, loom::single_device, loom::fp16> fabric; }
void case_cpu_fp16_mixed() { loom::Fabric<loom::cpu, loom::single_device, loom::fp16_mixed> fabric; }
void case_accelerator_untagged() { loom::Fabric<untagged, loom::single_device, loom::fp32> fabric; }
void case_arguments_swapped() { loom::Fabric<loom::single_device, loom::cpu, loom::fp32> fabric; }
void case_accelerator_incomplete() { loom::Fabric<accelerator_without_parse, loom::single_device, loom::fp32> fabric; }
void case_strategy_untagged() { loom::Fabric<loom::cpu, untagged, loom::fp32> fabric; }
void case_strategy_incomplete() { loom::Fabric<loom::cpu, strategy_tag_only, loom::fp32> fabric; }
void case_precision_untagged() { loom::Fabric<loom::cpu, loom::single_device, int> fabric; }
void case_precision_incomplete() { loom::Fabric<loom::cpu, loom::single_device, precision_without_dtypes> fabric; }
void case_strategy_not_on_cpu() { loom::Fabric<loom::cpu, cuda_only_strategy, loom::fp32> fabric; }
