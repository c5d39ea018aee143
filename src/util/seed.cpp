#include <loom/environment.hpp>
#include <loom/errors.hpp>
#include <loom/util/seed.hpp>

#include <ATen/Context.h>

#include <cstdlib>
#include <random>
#include <string>

namespace loom {

std::optional<std::uint64_t> global_seed_from_environment() {
  const auto value = cluster::setting_integer("PL_GLOBAL_SEED", 0, static_cast<long long>(max_seed_value));
  if (!value) return std::nullopt;
  return static_cast<std::uint64_t>(*value);
}

std::uint64_t seed_everything(std::optional<std::uint64_t> seed) {
  if (!seed) seed = global_seed_from_environment();
  if (!seed) {
    std::random_device entropy;
    seed = std::uniform_int_distribution<std::uint64_t>(0, max_seed_value)(entropy);
  }
  if (*seed > max_seed_value) {
    throw configuration_error("seed_everything(" + std::to_string(*seed) + "): the seed must be from 0 to " +
                              std::to_string(max_seed_value));
  }
  at::manual_seed(*seed);  // the CPU generator and, where present, every CUDA one
  std::srand(static_cast<unsigned>(*seed));
  cluster::export_variable("PL_GLOBAL_SEED", std::to_string(*seed));  // for the ranks started after it
  return *seed;
}

}  // namespace loom
