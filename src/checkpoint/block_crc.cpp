#include "block_crc.hpp"

#include "file_bytes.hpp"
#include "torch_archive.hpp"

#include <cstring>

namespace loom::detail {

namespace {

constexpr std::string_view table_magic = "LOOMBC01";

void put_little_endian(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

void block_crc_table::add(const char* data, std::size_t bytes) {
  record_blocks record{bytes, {}};
  for (std::uint64_t at = 0; at < bytes; at += record_block_bytes) {
    const auto size = static_cast<std::size_t>(std::min<std::uint64_t>(record_block_bytes, bytes - at));
    record.crcs.push_back(crc32_of(data + at, size));
  }
  records_.push_back(std::move(record));
}

std::string block_crc_table::bytes() const {
  std::string out(table_magic);
  put_little_endian(out, record_block_bytes, 8);
  put_little_endian(out, records_.size(), 8);
  for (const auto& record : records_) {
    put_little_endian(out, record.bytes, 8);
    for (const std::uint32_t crc : record.crcs) put_little_endian(out, crc, 4);
  }
  return out;
}

block_crcs parse_block_crc_table(std::string_view bytes, const std::string& path) {
  const std::string what = "record '" + std::string(block_crc_record) + "' ";
  std::size_t at = 0;
  auto take = [&](int size) {
    if (bytes.size() - at < static_cast<std::size_t>(size)) fail_checkpoint(path, what + "is truncated");
    const std::uint64_t value = little_endian(bytes.data() + at, size);
    at += static_cast<std::size_t>(size);
    return value;
  };
  if (bytes.size() < table_magic.size() || bytes.substr(0, table_magic.size()) != table_magic) {
    fail_checkpoint(path, what + "does not start with " + std::string(table_magic));
  }
  at = table_magic.size();
  block_crcs table;
  table.block_bytes = take(8);
  // Within what one read buffer holds, so that a block is read at once.
  if (table.block_bytes < 4096 || table.block_bytes > (std::uint64_t{64} << 20)) {
    fail_checkpoint(path, what + "states blocks of " + std::to_string(table.block_bytes) +
                              " bytes (4 KiB to 64 MiB are accepted)");
  }
  const std::uint64_t count = take(8);
  // Each record takes at least 8 bytes of the table: a count past that is forged.
  if (count > (bytes.size() - at) / 8) fail_checkpoint(path, what + "states more records than it holds");
  table.records.reserve(static_cast<std::size_t>(count));
  for (std::uint64_t i = 0; i < count; ++i) {
    record_blocks record;
    record.bytes = take(8);
    const std::uint64_t blocks = record.bytes / table.block_bytes + (record.bytes % table.block_bytes != 0 ? 1 : 0);
    if (blocks > (bytes.size() - at) / 4) fail_checkpoint(path, what + "is truncated");
    record.crcs.reserve(static_cast<std::size_t>(blocks));
    for (std::uint64_t b = 0; b < blocks; ++b) record.crcs.push_back(static_cast<std::uint32_t>(take(4)));
    table.records.push_back(std::move(record));
  }
  if (at != bytes.size()) fail_checkpoint(path, what + "has bytes past its last record");
  return table;
}

}  // namespace loom::detail
