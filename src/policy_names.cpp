// Lightning's accelerator and precision spellings.
#include <loom/policy_names.hpp>

#include <algorithm>

namespace loom {

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names = {"64-true", "32-true", "16-true", "bf16-true", "16-mixed",
                                                 "bf16-mixed", "64", "32", "16", "bf16"};
  return names;
}

std::optional<std::string> canonical_precision(std::string_view name) {
  if (name == "64") return "64-true";
  if (name == "32") return "32-true";
  if (name == "16") return "16-mixed";
  if (name == "bf16") return "bf16-mixed";
  for (const auto& known : precision_names()) {
    if (known == name) return known;
  }
  return std::nullopt;
}

const std::vector<std::string>& accelerator_names() {
  // Lightning's, then each built-in accelerator Lightning does not name.
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = {"cpu", "gpu", "cuda", "mps", "tpu", "auto"};
#define LOOM_ACCELERATOR(type, device, fp16_compute) \
  if (std::find(all.begin(), all.end(), #type) == all.end()) all.emplace_back(#type);
#include <loom/builtin_accelerators.def>
#undef LOOM_ACCELERATOR
    return all;
  }();
  return names;
}

std::optional<std::string> canonical_accelerator(std::string_view name) {
  if (name == "gpu") return "cuda";
  for (const auto& known : accelerator_names()) {
    if (known == name) return known;
  }
  return std::nullopt;
}

}  // namespace loom
