// loom::cuda's run-time queries. Kept out of line so user TUs need no CUDA
// headers and the "built without CUDA" answer is fixed when loom is built.
#include <loom/accelerator/cuda.hpp>
#include <loom/errors.hpp>

#include <torch/cuda.h>

namespace loom {

bool cuda::built_with_cuda() noexcept {
#if defined(LOOM_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

bool cuda::is_available() { return built_with_cuda() && torch::cuda::is_available(); }

int cuda::device_count() { return is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

device_selection cuda::parse_devices(const devices_spec& devices) {
  if (!built_with_cuda()) {
    throw configuration_error(
        "accelerator 'cuda' was requested, but LibTorch was built without CUDA (this loom build links a LibTorch "
        "that has no libtorch_cuda). Use loom::cpu, or rebuild loom with -Dlibtorch_dir pointing at a CUDA build "
        "of LibTorch.");
  }
  const int available = device_count();
  if (available == 0) {
    throw configuration_error(
        "accelerator 'cuda' was requested, but no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the "
        "driver). Use loom::cpu to run on the host.");
  }
  return device_selection{detail::parse_cuda_devices(devices, available)};
}

}  // namespace loom
