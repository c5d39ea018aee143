#include <loom/errors.hpp>
#include <loom/util/seed.hpp>

#include <ATen/Context.h>

#include <charconv>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>

namespace loom {

std::optional<std::uint64_t> global_seed_from_environment() {
  const char* text = std::getenv("PL_GLOBAL_SEED");
  if (text == nullptr || *text == '\0') return std::nullopt;
  std::uint64_t value = 0;
  const std::string_view view(text);
  auto [ptr, ec] = std::from_chars(view.data(), view.data() + view.size(), value);
  if (ec != std::errc{} || ptr != view.data() + view.size() || value > max_seed_value) {
    throw configuration_error("PL_GLOBAL_SEED='" + std::string(view) + "' is not a seed (an integer from 0 to " +
                              std::to_string(max_seed_value) + ")");
  }
  return value;
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
  ::setenv("PL_GLOBAL_SEED", std::to_string(*seed).c_str(), 1);
  return *seed;
}

}  // namespace loom
