// Reading binary file fields: little-endian integers and zlib's CRC32 over
// buffers of any size. Internal to src/checkpoint.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace loom::detail {

inline std::uint64_t little_endian(const char* data, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= std::uint64_t{static_cast<unsigned char>(data[i])} << (8 * i);
  return value;
}

// zlib's crc32 takes 32-bit lengths: the buffer goes in chunks. crc32_update
// continues a CRC over the next bytes (a file written as it is produced).
inline std::uint32_t crc32_update(std::uint32_t running, const char* data, std::size_t size) {
  uLong crc = running;
  while (size > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(size, 1U << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    size -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}
inline std::uint32_t crc32_of(const char* data, std::size_t size) {
  return crc32_update(static_cast<std::uint32_t>(crc32(0L, Z_NULL, 0)), data, size);
}

// Whether bytes match the CRC32 a file recorded for them. The fuzzing build
// (tests/fuzz/build.sh, -DLOOM_FUZZING) accepts every CRC, so that mutated
// bytes reach the parsers behind the check instead of stopping at it.
inline bool crc_matches(const char* data, std::size_t size, std::uint32_t recorded) {
#ifdef LOOM_FUZZING
  (void)data, (void)size, (void)recorded;
  return true;
#else
  return crc32_of(data, size) == recorded;
#endif
}

}  // namespace loom::detail
