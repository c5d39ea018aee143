// The bytes this process has read from files so far (read and pread:
// /proc/self/io's rchar; a mapping's page faults do not count), for tests
// that bound what a reader reads.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace loom_test {

inline std::int64_t bytes_read() {
  std::ifstream io("/proc/self/io");
  std::string key;
  std::int64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

}  // namespace loom_test
