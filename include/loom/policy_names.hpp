// Lightning's spellings of accelerators and precisions and their canonical
// forms: vocabulary every layer may use (the connector, loom-run, and the
// launcher-agreement check of a static Fabric). No torch headers.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// Precision strings Lightning accepts, canonical ones first.
const std::vector<std::string>& precision_names();
// "32" -> "32-true", "16" -> "16-mixed", "bf16" -> "bf16-mixed", "64" -> "64-true",
// canonical names unchanged; nullopt for an unknown name.
std::optional<std::string> canonical_precision(std::string_view name);

// cpu, gpu, cuda, mps, tpu, auto, and any built-in accelerator (builtin_accelerators.def) besides.
const std::vector<std::string>& accelerator_names();
// "gpu" -> "cuda"; others unchanged; nullopt when unknown.
std::optional<std::string> canonical_accelerator(std::string_view name);

}  // namespace loom
