// The manifest protocol of multi-file checkpoints (manifest.hpp).
#include "manifest.hpp"

#include "checkpoint_bytes.hpp"
#include "file_bytes.hpp"
#include "torch_archive.hpp"

#include <loom/checkpoint/io.hpp>
#include <loom/errors.hpp>

#include <ATen/ATen.h>

#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <span>

namespace loom::detail {
namespace fs = std::filesystem;

std::string fresh_staging_directory(const std::string& parent, const std::string& prefix) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) fs::remove_all(entry.path(), ec);
  }
  const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
  const fs::path staged = fs::path(parent) / (prefix + std::to_string(::getpid()) + "-" + std::to_string(stamp));
  fs::create_directories(staged, ec);
  return ec ? "!cannot create the staging directory " + staged.string() + " (" + ec.message() + ")" : staged.string();
}

std::string agree_on_staging(const std::string& path, std::string answer, comm::process_group& group) {
  if (group.valid()) answer = group.broadcast_object(c10::IValue(answer), 0).toStringRef();
  if (!answer.empty() && answer.front() == '!') fail_checkpoint(path, answer.substr(1));
  return answer;
}

listed_file write_listed(const fs::path& staged, const std::string& name, const c10::impl::GenericDict& entries) {
  const written_file written = write_entries((staged / name).string(), entries);
  return {name, written.bytes, static_cast<std::int64_t>(written.crc32)};
}

std::vector<listed_file> gather_listed(comm::process_group& group, const std::vector<listed_file>& mine,
                                       const std::function<std::string(int rank, std::size_t slot)>& name_of) {
  std::vector<std::int64_t> report;
  for (const auto& file : mine) {
    report.push_back(file.bytes);
    report.push_back(file.crc32);
  }
  const at::Tensor local =
      at::tensor(report, at::TensorOptions().dtype(at::kLong)).to(group.valid() ? group.device() : c10::Device(at::kCPU));
  const at::Tensor everyone = (group.valid() ? group.all_gather_stacked(local) : local.unsqueeze(0)).to(at::kCPU);
  std::vector<listed_file> out;
  for (int r = 0; r < static_cast<int>(everyone.size(0)); ++r) {
    for (std::size_t slot = 0; slot < mine.size(); ++slot) {
      const auto column = static_cast<std::int64_t>(2 * slot);
      const std::int64_t bytes = everyone[r][column].item<std::int64_t>();
      if (bytes < 0) continue;
      out.push_back({name_of(r, slot), bytes, everyone[r][column + 1].item<std::int64_t>()});
    }
  }
  return out;
}

c10::IValue listed_value(const std::vector<listed_file>& files) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const auto& file : files) {
    c10::impl::GenericDict entry(c10::StringType::get(), c10::AnyType::get());
    entry.insert("name", file.name);
    entry.insert("bytes", file.bytes);
    entry.insert("crc32", file.crc32);
    list.push_back(entry);
  }
  return list;
}

namespace {

// One entry of an index's list as listed_value wrote it, every field's type
// and range checked: the index is a file from outside.
listed_file listed_entry(const c10::IValue& item, const std::string& index_path) {
  const auto refuse = [&index_path]() {
    fail_checkpoint(index_path, "lists a file as something other than {'name': str, 'bytes': int >= 0, 'crc32': int "
                                "in [0, 2^32)} (a forged or damaged index)");
  };
  if (!item.isGenericDict()) refuse();
  const auto dict = item.toGenericDict();
  const auto field = [&dict](const char* key) -> std::optional<c10::IValue> {
    const auto found = dict.find(key);
    if (found == dict.end()) return std::nullopt;
    return found->value();
  };
  const auto name = field("name");
  const auto bytes = field("bytes");
  const auto crc = field("crc32");
  if (dict.size() != 3 || !name || !name->isString() || !bytes || !bytes->isInt() || bytes->toInt() < 0 || !crc ||
      !crc->isInt() || crc->toInt() < 0 || crc->toInt() > 0xFFFFFFFFLL) {
    refuse();
  }
  return {name->toStringRef(), bytes->toInt(), crc->toInt()};
}

}  // namespace

std::vector<listed_file> listed_files(const checkpoint_contents& index, const fs::path& index_path) {
  auto listed = index.entries.find(files_key);
  if (listed == index.entries.end() || !listed->value().isList()) {
    fail_checkpoint(index_path.string(), "does not list the other files (not a loom multi-file checkpoint's index)");
  }
  std::vector<listed_file> files;
  for (const auto& item : listed->value().toListRef()) files.push_back(listed_entry(item, index_path.string()));
  return files;
}

file_bytes open_listed(const confined_directory& directory, const listed_file& file, const checkpoint_contents& index,
                       const fs::path& index_path, bool map_file) {
  const std::string index_name = index_path.filename().string();
  auto loaded = directory.load(file.name, map_file);
  if (!loaded) {
    fail_checkpoint(directory.path(), "is missing " + file.name + ", which " + index_name + " lists (a job of " +
                                          std::to_string(index.metadata.world_size) +
                                          " ranks wrote it); nothing was changed");
  }
  const std::size_t size = loaded->bytes().size();
  if (static_cast<std::int64_t>(size) != file.bytes) {
    fail_checkpoint(directory.path_of(file.name), "has " + std::to_string(size) + " bytes, " + index_name + " says " +
                                                      std::to_string(file.bytes) + " (torn or replaced); nothing was changed");
  }
  return std::move(*loaded);
}

void check_same_save(const checkpoint_contents& contents, const checkpoint_contents& index, const std::string& path,
                     const fs::path& index_path) {
  if (contents.metadata.world_size != index.metadata.world_size) {
    fail_checkpoint(path, "was written by a job of " + std::to_string(contents.metadata.world_size) + " ranks, " +
                              index_path.filename().string() + " by one of " +
                              std::to_string(index.metadata.world_size) + " (files of two saves mixed)");
  }
}

std::vector<std::pair<std::string, checkpoint_contents>> read_listed(const confined_directory& directory,
                                                                     const checkpoint_contents& index,
                                                                     const fs::path& index_path, bool map_files) {
  const std::string index_name = index_path.filename().string();
  // Each file read onto the heap, or mapped (then its tensors lie over its pages).
  struct listed_bytes {
    std::string path;
    file_bytes file;
  };
  // Every file is checked (present, size, CRC32) before any is parsed.
  std::vector<listed_bytes> files;
  for (const listed_file& file : listed_files(index, index_path)) {
    listed_bytes found{directory.path_of(file.name), open_listed(directory, file, index, index_path, map_files)};
    const std::span<const char> bytes = found.file.bytes();
    if (!crc_matches(bytes.data(), bytes.size(), static_cast<std::uint32_t>(file.crc32))) {
      fail_checkpoint(found.path, "does not match the CRC32 " + index_name + " recorded (corrupted); nothing was changed");
    }
    // Checked: its pages leave the resident set until a record is read.
    if (found.file.mapped) drop_mapped_pages(bytes.data(), bytes.size());
    files.push_back(std::move(found));
  }
  std::vector<std::pair<std::string, checkpoint_contents>> out;
  for (auto& file : files) {
    checkpoint_contents contents = parse_checkpoint(file.file.bytes(), file.path, file.file.mapped);
    // The parse checked every record's CRC32: its pages go back too.
    if (file.file.mapped) drop_mapped_pages(file.file.bytes().data(), file.file.bytes().size());
    file.file = {};  // the tensors hold the mapping
    check_same_save(contents, index, file.path, index_path);
    out.emplace_back(fs::path(file.path).filename().string(), std::move(contents));
  }
  return out;
}

}  // namespace loom::detail
