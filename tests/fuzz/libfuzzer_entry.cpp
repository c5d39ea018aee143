// libFuzzer's entry for one target, chosen at compile time
// (-DLOOM_FUZZ_TARGET=pickle ...; tests/fuzz/build.sh builds one binary each).
#include "targets.hpp"

#ifndef LOOM_FUZZ_TARGET
#define LOOM_FUZZ_TARGET pickle  // a default, so the file compiles alone (tests/check_portability.py)
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return loom_fuzz::LOOM_FUZZ_TARGET(data, size);
}
