// Writing and reading torch zip archives for checkpoints (torch_archive.hpp).
#include "torch_archive.hpp"
#include "file_bytes.hpp"

#include "python_pickle.hpp"
#include "block_crc.hpp"
#include "structure_budget.hpp"
#include "tensor_records.hpp"

#include <loom/errors.hpp>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <caffe2/serialize/versions.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom::detail {
namespace {

// The IValue with every list generic (an int or tensor list would be written
// through torch.jit._pickle.build_intlist and friends, which weights_only
// refuses) and every dict and tuple rebuilt over converted values.
c10::IValue generic(const c10::IValue& value) {
  if (value.isList()) {
    c10::impl::GenericList list(c10::AnyType::get());
    for (const c10::IValue& element : value.toListRef()) list.push_back(generic(element));
    return list;
  }
  if (value.isGenericDict()) {
    const auto source = value.toGenericDict();
    c10::impl::GenericDict dict(source.keyType(), c10::AnyType::get());
    for (const auto& item : source) dict.insert(item.key(), generic(item.value()));
    return dict;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& element : value.toTupleRef().elements()) elements.push_back(generic(element));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return value;
}

class vector_adapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit vector_adapter(const std::vector<char>& bytes) : bytes_(&bytes) {}
  size_t size() const override { return bytes_->size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_->size()) return 0;
    const size_t count = std::min<size_t>(n, bytes_->size() - pos);
    std::memcpy(buf, bytes_->data() + pos, count);
    return count;
  }

 private:
  const std::vector<char>* bytes_;
};

}  // namespace

void fail_checkpoint(const std::string& path, const std::string& why) {
  throw checkpoint_error("checkpoint " + path + ": " + why);
}

bool is_libtorch_archive(const std::vector<char>& bytes) {
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<vector_adapter>(bytes));
  return reader.hasRecord("constants.pkl");
}

void release_backing(void* held) { delete static_cast<std::shared_ptr<const void>*>(held); }

bool lies_over_backing(const at::Tensor& tensor) { return record_deleted_by(tensor, &release_backing); }

void write_torch_archive(const c10::IValue& root, const std::function<void(const char*, std::size_t)>& sink,
                         const std::function<at::Tensor(const at::Tensor&)>& materialize) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&pickle](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(generic(root));
  pickler.stop();

  // No exception may cross the zip writer (C code, whose destructor writes
  // the end of the archive too): the sink's first error is kept, the rest
  // of the bytes dropped, and the error thrown once the writer is done.
  std::exception_ptr failure;
  caffe2::serialize::PyTorchStreamWriter writer([&sink, &failure](const void* data, size_t size) {
    if (!failure) {
      try {
        sink(static_cast<const char*>(data), size);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    return size;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  // As PyTorch 2.x writes it, so its torch.load need not guess.
  static constexpr char byteorder[] = "little";
  writer.writeRecord("byteorder", byteorder, sizeof(byteorder) - 1);
  const std::vector<at::Tensor>& storages = pickler.tensorData();
  block_crc_table blocks;
  for (std::size_t i = 0; i < storages.size(); ++i) {
    const auto data = torch::jit::getWriteableTensorData(materialize ? materialize(storages[i]) : storages[i]);
    blocks.add(data.data(), data.sizeInBytes());
    writer.writeRecord("data/" + std::to_string(i), data.data(), data.sizeInBytes());
  }
  const std::string table = blocks.bytes();
  writer.writeRecord(std::string(block_crc_record), table.data(), table.size());
  writer.writeEndOfFile();
  if (failure) std::rethrow_exception(failure);
}

std::vector<char> write_torch_archive(const c10::IValue& root) {
  std::vector<char> archive;
  write_torch_archive(root, [&archive](const char* data, std::size_t size) { archive.insert(archive.end(), data, data + size); });
  return archive;
}

namespace {

// [offset, offset + length) lies inside a buffer of `size` bytes (no sum
// that could wrap around: the fields come from the file).
bool fits(std::uint64_t offset, std::uint64_t length, std::uint64_t size) {
  return offset <= size && length <= size - offset;
}

struct zip_directory {
  std::uint64_t entries = 0, offset = 0, size = 0;
};

// The end of central directory record (and its ZIP64 form): where the
// directory is and how many entries it has, inside the file.
zip_directory find_directory(const char* data, std::size_t size, const std::string& path) {
  // 22 bytes plus a comment of at most 64 KiB, at the end.
  constexpr std::size_t eocd_size = 22;
  if (size < eocd_size) fail_checkpoint(path, "is truncated (shorter than a zip directory)");
  std::size_t eocd = std::string::npos;
  const std::size_t lowest = size > eocd_size + 0xFFFF ? size - eocd_size - 0xFFFF : 0;
  for (std::size_t at = size - eocd_size + 1; at-- > lowest;) {
    if (little_endian(data + at, 4) == 0x06054b50) {
      eocd = at;
      break;
    }
  }
  if (eocd == std::string::npos) fail_checkpoint(path, "is truncated or not a zip archive (no end of central directory)");
  zip_directory directory{little_endian(data + eocd + 10, 2), little_endian(data + eocd + 16, 4),
                          little_endian(data + eocd + 12, 4)};
  // ZIP64: a locator just before the end record points at the ZIP64 end
  // record, whose fields then count, whatever the end record says (miniz,
  // under PyTorch's reader, reads them so: a directory loom read from the
  // end record alone could differ from the one torch.load reads).
  const bool zip64_located = eocd >= 20 && little_endian(data + eocd - 20, 4) == 0x07064b50;
  if (zip64_located || directory.entries == 0xFFFF || directory.size == 0xFFFFFFFF ||
      directory.offset == 0xFFFFFFFF) {
    if (!zip64_located) fail_checkpoint(path, "has a damaged ZIP64 directory");
    const std::uint64_t record = little_endian(data + eocd - 20 + 8, 8);
    if (!fits(record, 56, size) || little_endian(data + record, 4) != 0x06064b50) {
      fail_checkpoint(path, "has a damaged ZIP64 directory");
    }
    directory = {little_endian(data + record + 32, 8), little_endian(data + record + 48, 8),
                 little_endian(data + record + 40, 8)};
  }
  if (!fits(directory.offset, directory.size, size)) {
    fail_checkpoint(path, "is truncated (its zip directory points past the end)");
  }
  // Each entry takes at least 46 bytes of the directory.
  if (directory.entries > directory.size / 46) {
    fail_checkpoint(path, "has a damaged zip directory (" + std::to_string(directory.entries) +
                              " entries declared in " + std::to_string(directory.size) + " bytes)");
  }
  return directory;
}

// One record: where its bytes are, as its local header places them.
std::string hex_text(std::uint64_t value) {
  char text[20];
  std::snprintf(text, sizeof text, "%04llx", static_cast<unsigned long long>(value));
  return text;
}

struct zip_record {
  std::string_view name;  // a view into the file's bytes
  std::uint64_t header = 0, start = 0, bytes = 0;
  std::uint32_t crc = 0;
};

template <class T>
using budgeted = std::vector<T, budget_allocator<T>>;

// The directory's entries, each checked against its local header and the
// file's bounds (every field comes from the file).
budgeted<zip_record> read_entries(const char* data, std::size_t size, const zip_directory& directory,
                                  const std::string& path, structure_budget& budget) {
  const std::uint64_t directory_end = directory.offset + directory.size;
  budgeted<zip_record> records{budget_allocator<zip_record>(budget)};
  records.reserve(static_cast<std::size_t>(directory.entries));
  std::uint64_t at = directory.offset;
  for (std::uint64_t i = 0; i < directory.entries; ++i) {
    if (!fits(at, 46, directory_end) || little_endian(data + at, 4) != 0x02014b50) {
      fail_checkpoint(path, "has a damaged zip directory");
    }
    const auto method = little_endian(data + at + 10, 2);
    const auto flags = little_endian(data + at + 8, 2);
    zip_record record;
    record.crc = static_cast<std::uint32_t>(little_endian(data + at + 16, 4));
    std::uint64_t compressed = little_endian(data + at + 20, 4);
    std::uint64_t uncompressed = little_endian(data + at + 24, 4);
    const std::size_t name_length = little_endian(data + at + 28, 2);
    const std::size_t extra_length = little_endian(data + at + 30, 2);
    const std::size_t comment_length = little_endian(data + at + 32, 2);
    record.header = little_endian(data + at + 42, 4);
    if (!fits(at + 46, name_length + extra_length + comment_length, directory_end)) {
      fail_checkpoint(path, "has a damaged zip directory");
    }
    record.name = std::string_view(data + at + 46, name_length);
    // ZIP64 extended information: the 0xFFFFFFFF fields, in this order, each
    // read only inside the block its length gives.
    for (std::size_t extra = at + 46 + name_length, end = extra + extra_length; extra + 4 <= end;) {
      const auto id = little_endian(data + extra, 2);
      const std::size_t length = little_endian(data + extra + 2, 2);
      if (!fits(extra + 4, length, end)) fail_checkpoint(path, "has a damaged zip directory (record '" + std::string(record.name) + "')");
      if (id == 0x0001) {
        std::size_t field = extra + 4;
        auto next = [&](std::uint64_t& value) {
          if (value != 0xFFFFFFFF) return;
          if (!fits(field, 8, extra + 4 + length)) fail_checkpoint(path, "has a damaged ZIP64 field in record '" + std::string(record.name) + "'");
          value = little_endian(data + field, 8);
          field += 8;
        };
        next(uncompressed);
        next(compressed);
        next(record.header);
      }
      extra += 4 + length;
    }
    if (method != 0 || compressed != uncompressed) {
      fail_checkpoint(path, "holds a compressed record '" + std::string(record.name) + "'; torch archives store their records uncompressed");
    }
    // Only the data-descriptor and UTF-8 name flags: torch archives are
    // never encrypted or patched, and PyTorch's reader (miniz) refuses such
    // records.
    constexpr std::uint64_t plain_flags = 0x0008 | 0x0800;
    if ((flags & ~plain_flags) != 0) {
      fail_checkpoint(path, "holds record '" + std::string(record.name) + "' with zip flags 0x" + hex_text(flags) +
                                " (encrypted, patched or masked): torch archives use none of them");
    }
    if (!fits(record.header, 30, size) || little_endian(data + record.header, 4) != 0x04034b50) {
      fail_checkpoint(path, "is truncated or damaged (record '" + std::string(record.name) + "' has no local header)");
    }
    // The local header must name the record the directory names.
    const std::size_t local_name = little_endian(data + record.header + 26, 2);
    const std::size_t local_extra = little_endian(data + record.header + 28, 2);
    if (!fits(record.header + 30, local_name + local_extra, size) || local_name != name_length ||
        std::memcmp(data + record.header + 30, record.name.data(), name_length) != 0) {
      fail_checkpoint(path, "is damaged: the directory's record '" + std::string(record.name) +
                                "' does not match the local header it points at");
    }
    if ((little_endian(data + record.header + 6, 2) & ~plain_flags) != 0) {
      fail_checkpoint(path, "holds record '" + std::string(record.name) + "' whose local header has zip flags 0x" +
                                hex_text(little_endian(data + record.header + 6, 2)) +
                                " (encrypted, patched or masked): torch archives use none of them");
    }
    record.start = record.header + 30 + local_name + local_extra;
    record.bytes = compressed;
    if (!fits(record.start, record.bytes, size)) {
      fail_checkpoint(path, "is truncated (record '" + std::string(record.name) + "' runs past the end of the file)");
    }
    records.push_back(std::move(record));
    at += 46 + name_length + extra_length + comment_length;
  }
  return records;
}

bool less_without_case(std::string_view a, std::string_view b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) < std::tolower(static_cast<unsigned char>(y));
  });
}

void refuse_shared_bytes(const budgeted<zip_record>& records, const zip_directory& directory,
                         const std::string& path, structure_budget& budget) {
  const std::uint64_t directory_end = directory.offset + directory.size;
  // Each record once, in bytes of its own: one record listed a thousand
  // times (to be checked a thousand times), or two names for one record's
  // bytes, are refused before any CRC is computed.
  // Names compare without case: miniz, under PyTorch's reader, finds a
  // record by name case-insensitively, so 'data.pkl' and 'DATA.PKL' would be
  // two records loom sees and one torch.load reads.
  budgeted<const zip_record*> by_name{budget_allocator<const zip_record*>(budget)};
  by_name.reserve(records.size());
  for (const auto& record : records) by_name.push_back(&record);
  std::sort(by_name.begin(), by_name.end(),
            [](const zip_record* a, const zip_record* b) { return less_without_case(a->name, b->name); });
  for (std::size_t i = 1; i < by_name.size(); ++i) {
    if (!less_without_case(by_name[i - 1]->name, by_name[i]->name)) {
      fail_checkpoint(path, "is damaged: its zip directory lists '" + std::string(by_name[i]->name) +
                                "' twice (names compared without case)");
    }
  }
  budgeted<const zip_record*> by_offset{budget_allocator<const zip_record*>(budget)};
  by_offset.reserve(records.size());
  for (const auto& record : records) by_offset.push_back(&record);
  std::sort(by_offset.begin(), by_offset.end(), [](const zip_record* a, const zip_record* b) { return a->header < b->header; });
  for (std::size_t i = 0; i < by_offset.size(); ++i) {
    const zip_record& record = *by_offset[i];
    const std::uint64_t end = record.start + record.bytes;
    if (i + 1 < by_offset.size() && end > by_offset[i + 1]->header) {
      fail_checkpoint(path, "is damaged: records '" + std::string(record.name) + "' and '" +
                                std::string(by_offset[i + 1]->name) + "' overlap");
    }
    if (record.header < directory_end && end > directory.offset) {
      fail_checkpoint(path, "is damaged: record '" + std::string(record.name) + "' overlaps the zip directory");
    }
  }
}

// The archive as loom reads it: LibTorch's own zip reader (miniz) is not
// used on files from outside. It threw from its constructor on a bad
// version record or an encrypted record, after miniz allocated its state,
// which then leaked once per such file; and it read a ZIP64 directory where
// loom read the end record, so the two could see different records (both
// found by fuzzing: tests/fuzz/). What the unpickler reads is what loom's
// walk checked.
struct torch_zip {
  explicit torch_zip(structure_budget& budget)
      : records(budget_allocator<zip_record>(budget)),
        by_name(0, std::hash<std::string_view>(), std::equal_to<>(),
                budget_allocator<std::pair<const std::string_view, std::size_t>>(budget)) {}

  std::string folder;          // "archive/": the first record's folder, which every lookup names
  std::uint64_t version = 0;   // the folder's version record
  budgeted<zip_record> records;
  // Name -> position in records (names are unique: refuse_shared_bytes), so
  // a checkpoint of many tensors finds each record without a scan of all.
  std::unordered_map<std::string_view, std::size_t, std::hash<std::string_view>, std::equal_to<>,
                     budget_allocator<std::pair<const std::string_view, std::size_t>>>
      by_name;

  const zip_record* find(std::string_view name) const {
    std::string full = folder;
    full += name;
    const auto found = by_name.find(std::string_view(full));
    return found == by_name.end() ? nullptr : &records[found->second];
  }
};

// The folder (the first record's, as torch.load and LibTorch take it) and
// its version record: digits and an optional newline, as every writer
// writes it, within what LibTorch 1.13 reads.
void read_folder_and_version(torch_zip& zip, const char* data, const std::string& path) {
  if (zip.records.empty()) fail_checkpoint(path, "is a zip archive with no records: not a torch file");
  const std::string_view first = zip.records.front().name;
  const std::size_t slash = first.find('/');
  if (slash == std::string::npos) {
    fail_checkpoint(path, "is a zip archive whose first record '" + std::string(first) +
                              "' is not in a folder: not a torch file");
  }
  zip.folder = std::string(first.substr(0, slash + 1));
  const zip_record* version = zip.find("version");
  if (version == nullptr) version = zip.find(".data/version");
  if (version == nullptr) fail_checkpoint(path, "has no record '" + zip.folder + "version': not a torch file");
  std::string_view text(data + version->start, version->bytes);
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  bool digits = !text.empty() && text.size() <= 3;
  for (const char c : text) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) zip.version = zip.version * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (!digits || zip.version < caffe2::serialize::kMinSupportedFileFormatVersion ||
      zip.version > caffe2::serialize::kMaxSupportedFileFormatVersion) {
    fail_checkpoint(path, "record '" + std::string(version->name) + "' does not hold a format version LibTorch reads (" +
                              std::to_string(caffe2::serialize::kMinSupportedFileFormatVersion) + " to " +
                              std::to_string(caffe2::serialize::kMaxSupportedFileFormatVersion) + ")");
  }
}

// Fills zip (whose containers the budget charges) from the file's bytes.
// check_storages false: the storage records (data/<key>) are left for a
// ranged reader to check as it reads them; the others are checked here.
void read_torch_zip(std::span<const char> bytes, const std::string& path, structure_budget& budget, torch_zip& zip,
                    bool check_storages = true) {
  const char* data = bytes.data();
  const zip_directory directory = find_directory(data, bytes.size(), path);
  try {
    zip.records = read_entries(data, bytes.size(), directory, path, budget);
    refuse_shared_bytes(zip.records, directory, path, budget);
    zip.by_name.reserve(zip.records.size());
    for (std::size_t i = 0; i < zip.records.size(); ++i) zip.by_name.emplace(zip.records[i].name, i);
  } catch (const checkpoint_error&) {
    throw;
  } catch (const std::runtime_error& error) {  // the structure budget
    fail_checkpoint(path, std::string("has a zip directory of ") + std::to_string(directory.entries) +
                              " entries, and " + error.what());
  }
  read_folder_and_version(zip, data, path);
  const std::string storages = zip.folder + "data/";
  for (const auto& record : zip.records) {
    if (!check_storages && record.name.starts_with(storages)) continue;
    if (!crc_matches(data + record.start, record.bytes, record.crc)) {
      fail_checkpoint(path, "is corrupted (CRC32 mismatch) in record '" + std::string(record.name) + "'");
    }
  }
}

}  // namespace

void verify_zip_records(std::span<const char> bytes, const std::string& path) {
  structure_budget budget;
  verify_zip_records(bytes, path, budget);
}

void verify_zip_records(std::span<const char> bytes, const std::string& path, structure_budget& budget) {
  torch_zip zip(budget);
  read_torch_zip(bytes, path, budget, zip);
}

c10::IValue read_torch_archive(std::span<const char> bytes, const std::string& path) {
  structure_budget budget;
  return read_torch_archive(bytes, path, budget, nullptr);
}

namespace {

// The table's blocks of storage record data/<key>, checked against the
// zip directory's size of it; none where the table does not list the key.
void attach_blocks(unread_record& entry, const block_crcs& blocks, const std::string& key, const std::string& path) {
  if (blocks.records.empty() || key.empty() || key.size() > 18 ||
      key.find_first_not_of("0123456789") != std::string::npos) {
    return;
  }
  const std::uint64_t index = std::stoull(key);
  if (index >= blocks.records.size()) return;
  const record_blocks& listed = blocks.records[static_cast<std::size_t>(index)];
  if (listed.bytes != entry.bytes) {
    fail_checkpoint(path, "record '" + std::string(block_crc_record) + "' lists " + std::to_string(listed.bytes) +
                              " bytes for '" + entry.name + "', which holds " + std::to_string(entry.bytes));
  }
  entry.block_bytes = blocks.block_bytes;
  entry.block_crcs = listed.crcs;
}

c10::IValue read_archive(std::span<const char> bytes, const std::string& path, structure_budget& budget,
                         std::shared_ptr<const void> backing, unread_records* unread) {
  torch_zip zip(budget);
  read_torch_zip(bytes, path, budget, zip, /*check_storages=*/unread == nullptr);
  // A ranged reader checks the blocks it reads where loom's table lists
  // them (its record's zip CRC32 was checked with the others above).
  block_crcs blocks;
  if (const zip_record* table = zip.find(block_crc_record); table != nullptr && unread != nullptr) {
    blocks = parse_block_crc_table({bytes.data() + table->start, table->bytes}, path);
  }
  try {
    if (zip.find("constants.pkl") != nullptr) {
      fail_checkpoint(path, "is a LibTorch archive (torch::save(module or optimizer, path)), not a checkpoint; read it with "
                 "fabric.load_raw");
    }
    const zip_record* pickle_record = zip.find("data.pkl");
    if (pickle_record == nullptr) fail_checkpoint(path, "is a zip archive without data.pkl: not a torch file");
    const std::string_view pickle(bytes.data() + pickle_record->start, pickle_record->bytes);
    pickle_fixup fixed;
    try {
      fixed = validate_and_fix_pickle(
          pickle,
          [&zip](std::string_view key) -> std::optional<std::uint64_t> {
            const zip_record* record = zip.find("data/" + std::string(key));
            if (record == nullptr) return std::nullopt;
            return record->bytes;
          },
          budget);
    } catch (const std::runtime_error& error) {
      fail_checkpoint(path, std::string("record data.pkl cannot be decoded: ") + error.what());
    }
    if (fixed.protocol > 2) {
      fail_checkpoint(path, "was pickled with protocol " + std::to_string(fixed.protocol) +
                     ", and LibTorch 1.13 reads protocol 2 only, torch.save's default: save it without pickle_protocol");
    }
    if (fixed.has_ordered_dict) {
      fail_checkpoint(path, "holds a Python collections.OrderedDict (what model.state_dict() returns), which LibTorch 1.13 "
                 "cannot unpickle. Save a plain dict instead: torch.save(dict(model.state_dict()), path), or in a "
                 "checkpoint {'model': dict(model.state_dict()), ...}");
    }
    const std::string_view source =
        fixed.rewritten ? std::string_view(fixed.rewritten->data(), fixed.rewritten->size()) : pickle;
    std::size_t position = 0;
    auto read = [source, &position](char* buffer, size_t length) -> size_t {
      const size_t count = std::min(length, source.size() - position);
      std::memcpy(buffer, source.data() + position, count);
      position += count;
      return count;
    };
    tensor_records records([&zip, &bytes, &path, &backing, &blocks, unread](const std::string& name) {
      const zip_record* record = zip.find("data/" + name);
      if (record == nullptr) {
        fail_checkpoint(path, "record data.pkl names a storage record 'data/" + name + "' the archive does not hold");
      }
      char* start = const_cast<char*>(bytes.data()) + record->start;
      if (unread != nullptr && record->bytes > 0) {
        // Left unread: nothing computes on these pages (a ranged reader reads the bytes).
        unread_record& entry = (*unread)[start];
        entry = {std::string(record->name), record->start, record->bytes, record->crc, 0, {}};
        attach_blocks(entry, blocks, name, path);
        auto* hold = new std::shared_ptr<const void>(backing);
        at::DataPtr over(start, hold, &release_backing, c10::Device(c10::kCPU));
        return std::make_tuple(std::move(over), static_cast<std::size_t>(record->bytes));
      }
      if (backing && record->bytes > 0 && reinterpret_cast<std::uintptr_t>(start) % alignof(std::max_align_t) == 0) {
        // Over the backing's pages (a copy-on-write mapping), which live as long as a storage does.
        auto* hold = new std::shared_ptr<const void>(backing);
        at::DataPtr over(start, hold, &release_backing, c10::Device(c10::kCPU));
        return std::make_tuple(std::move(over), static_cast<std::size_t>(record->bytes));
      }
      at::DataPtr copy = c10::GetCPUAllocator()->allocate(record->bytes);
      if (record->bytes > 0) std::memcpy(copy.get(), bytes.data() + record->start, record->bytes);
      return std::make_tuple(std::move(copy), static_cast<std::size_t>(record->bytes));
    });
    // Every storage stays on the CPU (map_location="cpu"): LibTorch would
    // copy one stated on a GPU there before any view could be checked.
    torch::jit::Unpickler unpickler(read, /*type_resolver=*/nullptr, /*obj_loader=*/nullptr, std::ref(records),
                                    /*device=*/c10::Device(c10::kCPU));
    unpickler.set_version(zip.version);
    c10::IValue value = unpickler.parse_ivalue();
    records.check_views(value, path);
    return value;
  } catch (const checkpoint_error&) {
    throw;
  } catch (const std::exception& error) {
    fail_checkpoint(path, std::string("cannot be decoded: ") + error.what());
  }
}

}  // namespace

c10::IValue read_torch_archive(std::span<const char> bytes, const std::string& path, structure_budget& budget,
                               std::shared_ptr<const void> backing) {
  return read_archive(bytes, path, budget, std::move(backing), nullptr);
}

c10::IValue read_torch_archive_structure(std::span<const char> bytes, const std::string& path,
                                         structure_budget& budget, std::shared_ptr<const void> backing,
                                         unread_records& unread) {
  return read_archive(bytes, path, budget, std::move(backing), &unread);
}

}  // namespace loom::detail
