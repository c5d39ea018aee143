// The CPU accelerator: every process computes on the host; `devices` counts
// processes (Lightning's CPUAccelerator).
// With LOOM_ACCELERATOR defined, this header is its registry line alone
// (builtin_accelerators.def says why); otherwise the type.
#if defined(LOOM_ACCELERATOR)
LOOM_ACCELERATOR(cpu, cpu, false)
#elif !defined(LOOM_ACCELERATOR_CPU_HPP)
#define LOOM_ACCELERATOR_CPU_HPP

#include <loom/accelerator/parse_devices.hpp>
#include <loom/compat.hpp>
#include <loom/concepts.hpp>

#include <c10/core/Device.h>

#include <string_view>

namespace loom {

struct cpu {
  using loom_concept = accelerator_tag;
  static constexpr std::string_view name = "cpu";
  static constexpr c10::DeviceType device_type = c10::DeviceType::CPU;
  // fp16 compute (true fp16 matmul, fp16 autocast) runs on this accelerator.
  static constexpr bool supports_fp16_compute = LOOM_CPU_HAS_FP16_KERNELS != 0;

  static bool is_available() { return true; }
  // Processes are not bounded by a device count on CPU; one is the "auto" count.
  static int device_count() { return 1; }

  static device_selection parse_devices(const devices_spec& devices) {
    return device_selection{std::vector<int>(static_cast<std::size_t>(detail::parse_cpu_devices(devices)), -1)};
  }

  static c10::Device device(const device_selection& /*selection*/, int /*local_rank*/) {
    return c10::Device(c10::DeviceType::CPU);
  }
};

static_assert(Accelerator<cpu>);

}  // namespace loom

#endif  // LOOM_ACCELERATOR_CPU_HPP
