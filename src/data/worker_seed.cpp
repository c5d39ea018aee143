#include <loom/data/worker_seed.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

namespace loom::data {
namespace {
thread_local const at::Generator* current = nullptr;

// splitmix64: spreads (seed, rank, worker) over the seed space.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
}  // namespace

std::uint64_t worker_seed(std::uint64_t seed, std::size_t rank, int worker) {
  return mix(mix(mix(seed) ^ static_cast<std::uint64_t>(rank)) ^ static_cast<std::uint64_t>(worker));
}

at::Generator worker_generator() { return current != nullptr ? *current : at::detail::getDefaultCPUGenerator(); }

namespace detail {
void set_worker_generator(const at::Generator* generator) noexcept { current = generator; }
at::Generator make_worker_generator(std::uint64_t seed) { return at::detail::createCPUGenerator(seed); }
}  // namespace detail

}  // namespace loom::data
