// CRC32s per block of each tensor record, so that a rank reading part of a
// record (its slice of a full file, or of another world size's shard) checks
// exactly the bytes it reads. The zip format gives one CRC32 per record,
// which only a read of the whole record can check. loom's writer adds one
// record after the tensors, `loom_block_crc32` (torch.load ignores records
// it does not name), little-endian:
//   "LOOMBC01", u64 block bytes, u64 record count R,
//   then for storage record data/<i>, i = 0 .. R-1: u64 its bytes and
//   ceil(bytes / block) u32 CRC32s, one per block (the last may be short).
// A file without the table (Python's torch.save, LibTorch, older loom) is
// read a whole record at a time, checked against the zip's CRC32. The table
// is a record of the archive: its own zip CRC32 is checked before it is
// trusted, and every size in it must match the zip directory's. Internal to
// src/checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::detail {

// Small enough that a slice read for a part wastes little at its two ends
// (at most two blocks: 128 KiB), large enough that the table stays small
// (4 bytes per 64 KiB).
inline constexpr std::uint64_t record_block_bytes = std::uint64_t{64} << 10;
inline constexpr std::string_view block_crc_record = "loom_block_crc32";

// One record's blocks.
struct record_blocks {
  std::uint64_t bytes = 0;
  std::vector<std::uint32_t> crcs;
};

// The table's bytes, built as the writer writes each storage record in order.
class block_crc_table {
 public:
  void add(const char* data, std::size_t bytes);
  std::string bytes() const;

 private:
  std::vector<record_blocks> records_;
};

// Block bytes and each storage record's blocks (index i: data/<i>), from
// the table record's bytes; a checkpoint_error naming path if it is not one.
struct block_crcs {
  std::uint64_t block_bytes = 0;
  std::vector<record_blocks> records;
};
block_crcs parse_block_crc_table(std::string_view bytes, const std::string& path);

}  // namespace loom::detail
