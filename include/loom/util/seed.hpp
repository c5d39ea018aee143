// seed_everything: one seed for torch's generators (CPU and CUDA) and the C
// library's, exported as PL_GLOBAL_SEED so launched processes and samplers agree.
#pragma once

#include <cstdint>
#include <optional>

namespace loom {

inline constexpr std::uint64_t max_seed_value = 4294967295ULL;  // Lightning's bound (numpy's)

// Without a seed: PL_GLOBAL_SEED when set, else a random one. Returns the seed used.
std::uint64_t seed_everything(std::optional<std::uint64_t> seed = std::nullopt);

// PL_GLOBAL_SEED when set and valid.
std::optional<std::uint64_t> global_seed_from_environment();

}  // namespace loom
