#include <loom/errors.hpp>
#include <loom/util/random_state.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#if LOOM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <mutex>
#include <string>
#include <vector>

namespace loom {

namespace {
std::vector<at::Generator> default_generators() {
  std::vector<at::Generator> generators{at::detail::getDefaultCPUGenerator()};
#if LOOM_WITH_CUDA
  if (at::cuda::is_available()) {
    generators.push_back(at::cuda::detail::getDefaultCUDAGenerator(at::cuda::current_device()));
  }
#endif
  return generators;
}
}  // namespace

at::Tensor capture_random_state() {
  std::vector<at::Tensor> parts;
  for (auto& generator : default_generators()) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    parts.push_back(generator.get_state().flatten());
  }
  return at::cat(parts);
}

void restore_random_state(const at::Tensor& state) {
  auto generators = default_generators();
  std::vector<std::int64_t> sizes;
  std::int64_t total = 0;
  for (auto& generator : generators) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    sizes.push_back(generator.get_state().numel());
    total += sizes.back();
  }
  if (state.dim() != 1 || state.scalar_type() != at::kByte || state.numel() != total) {
    throw checkpoint_error("random state: the checkpoint holds " + std::to_string(state.numel()) +
                           " bytes of generator state, this process has " + std::to_string(total) +
                           " (a different build or device set)");
  }
  const at::Tensor bytes = state.to(at::kCPU).contiguous();
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < generators.size(); ++i) {
    std::lock_guard<std::mutex> lock(generators[i].mutex());
    generators[i].set_state(bytes.narrow(0, offset, sizes[i]).clone());
    offset += sizes[i];
  }
}

}  // namespace loom
