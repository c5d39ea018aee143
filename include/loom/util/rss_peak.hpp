// This process's resident-set high-water mark (Linux's VmHWM), and its
// reset: the cross-check of loom::counting_allocator that counts every page
// the process touched (LibTorch, Gloo, file buffers), for loom-bench and
// bench/{fsdp,zero}_memory. No torch headers.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace loom {

// VmHWM in bytes since the process started or the last reset_rss_peak();
// -1 where /proc/self/status has none.
inline std::int64_t rss_peak_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return -1;
}

// Starts a new high-water mark from the current resident set (clear_refs 5).
inline void reset_rss_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace loom
