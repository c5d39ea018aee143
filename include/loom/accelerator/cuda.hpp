// The CUDA accelerator. It compiles against every LibTorch; without CUDA in
// the LibTorch build it fails at run time with an error that says so.
// With LOOM_ACCELERATOR defined, this header is its registry line alone
// (builtin_accelerators.def says why); otherwise the type.
#if defined(LOOM_ACCELERATOR)
LOOM_ACCELERATOR(cuda, cuda, true)
#elif !defined(LOOM_ACCELERATOR_CUDA_HPP)
#define LOOM_ACCELERATOR_CUDA_HPP

#include <loom/accelerator/parse_devices.hpp>
#include <loom/concepts.hpp>

#include <c10/core/Device.h>

#include <string_view>

namespace loom {

struct cuda {
  using loom_concept = accelerator_tag;
  static constexpr std::string_view name = "cuda";
  static constexpr c10::DeviceType device_type = c10::DeviceType::CUDA;
  static constexpr bool supports_fp16_compute = true;
  // In the registry's product only when loom is built for CUDA (-Dcuda).
#if defined(LOOM_WITH_CUDA)
  static constexpr bool compiled_in = true;
#else
  static constexpr bool compiled_in = false;
#endif

  // Whether this loom build was compiled against a LibTorch with CUDA.
  static bool built_with_cuda() noexcept;
  static bool is_available();
  static int device_count();

  // Throws loom::configuration_error when LibTorch has no CUDA, when no device
  // is visible, or when `devices` asks for devices that do not exist.
  static device_selection parse_devices(const devices_spec& devices);

  static c10::Device device(const device_selection& selection, int local_rank) {
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(selection.indices.at(local_rank)));
  }
};

static_assert(Accelerator<cuda>);

}  // namespace loom

#endif  // LOOM_ACCELERATOR_CUDA_HPP
