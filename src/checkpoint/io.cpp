// Checkpoint files: atomic writes, verified reads, all-or-nothing loads, and
// state dicts written by LibTorch or Python.
#include <loom/checkpoint/io.hpp>
#include <loom/errors.hpp>

#include "checkpoint_bytes.hpp"
#include "file_bytes.hpp"
#include "structure_budget.hpp"
#include "torch_archive.hpp"
#include "../util/optimizer_families.hpp"
#include "../util/outside_files.hpp"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/strides.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <span>
#include <sstream>
#include <system_error>
#include <tuple>
#include <unordered_map>

namespace loom {
namespace fs = std::filesystem;
using detail::fail_checkpoint;
using detail::little_endian;
using detail::metadata_key;

namespace {
constexpr char magic[8] = {'L', 'O', 'O', 'M', 'C', 'K', 'P', 'T'};
}  // namespace

namespace detail {
std::vector<char> read_file(const std::string& path) {
  auto bytes = read_regular_file(path, no_size_limit, &fail_checkpoint);
  if (!bytes) fail_checkpoint(path, std::string("cannot open it (") + std::strerror(ENOENT) + ")");
  return std::move(*bytes);
}

c10::IValue metadata_value(const checkpoint_metadata& metadata) {
  c10::impl::GenericDict meta(c10::StringType::get(), c10::AnyType::get());
  meta.insert("format_version", checkpoint_format_version);
  meta.insert("world_size", metadata.world_size);
  meta.insert("global_rank", metadata.global_rank);
  meta.insert("strategy", metadata.strategy);
  meta.insert("precision", metadata.precision);
  c10::impl::GenericDict optimizer_types(c10::StringType::get(), c10::StringType::get());
  for (const auto& [name, type] : metadata.optimizer_types) optimizer_types.insert(name, type);
  meta.insert("optimizer_types", optimizer_types);
  if (!metadata.shards.empty()) {
    // name -> [begin, end, dim0, dim1, ...] of this rank's slice of the flattened parameter
    c10::impl::GenericDict shards(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [name, range] : metadata.shards) {
      c10::impl::GenericList item(c10::AnyType::get());
      item.push_back(range.begin);
      item.push_back(range.end);
      for (std::int64_t d : range.shape) item.push_back(d);
      shards.insert(name, item);
    }
    meta.insert("shards", shards);
    // name -> [dim, part, parts] of the tensor-parallel chunk the range is in
    c10::impl::GenericDict chunks(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [name, range] : metadata.shards) {
      if (range.dim < 0) continue;
      c10::impl::GenericList item(c10::AnyType::get());
      item.push_back(range.dim);
      item.push_back(range.part);
      item.push_back(range.parts);
      chunks.insert(name, item);
    }
    if (!chunks.empty()) meta.insert("tensor_parallel", chunks);
  }
  return meta;
}
}  // namespace detail

namespace {
using detail::read_file;

// A range a file states (metadata.shards, with its tensor-parallel chunk),
// checked as the file is parsed: it lies inside its tensor, whose shape is
// sane and whose chunks divide it, before anything is placed by it.
void check_range(const shard_range& range, const std::string& name, const std::string& path) {
  bool valid = range.dim < static_cast<std::int64_t>(range.shape.size()) && range.parts >= 1 && range.part >= 0 &&
               range.part < range.parts;
  std::int64_t numel = 1;
  for (std::int64_t d : range.shape) {
    valid = valid && d >= 0 && (d == 0 || numel <= (std::int64_t{1} << 48) / d);
    if (valid) numel *= d;
  }
  if (valid && range.dim >= 0) valid = range.shape[static_cast<std::size_t>(range.dim)] % range.parts == 0;
  const std::int64_t chunk = valid ? numel / range.parts : 0;
  if (!valid || range.begin < 0 || range.begin > range.end || range.end > chunk) {
    fail_checkpoint(path, "has a range for '" + name + "' ([" + std::to_string(range.begin) + ", " +
                              std::to_string(range.end) + ") of shape " + c10::str(at::IntArrayRef(range.shape)) +
                              ") that lies outside its tensor");
  }
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + ("'" + item + "'");
  return out;
}

// The parameter names of every module entry, for the optimizer entries.
detail::parameter_names names_of(const state& state) {
  detail::parameter_names names;
  for (const auto& entry : state.entries()) {
    if (const torch::nn::Module* module = entry.io().module()) names.add_module(*module);
  }
  return names;
}

}  // namespace

namespace detail {
written_file write_file_atomically(const std::string& path, const file_producer& produce) {
  static std::atomic<unsigned> counter{0};
  const fs::path target = fs::absolute(path);
  const fs::path directory = target.parent_path();
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec) fail_checkpoint(path, "cannot create directory " + directory.string() + " (" + ec.message() + ")");
  const fs::path temporary =
      directory / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                   std::to_string(counter.fetch_add(1)));

  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail_checkpoint(path, "cannot create " + temporary.string() + " (" + std::strerror(errno) + ")");
  auto abandon = [&](const std::string& why) {
    const int saved = errno;
    ::close(fd);
    ::unlink(temporary.c_str());
    fail_checkpoint(path, why + " (" + std::strerror(saved) + "); the previous file, if any, is untouched");
  };
  // The bytes go to the file as they are produced; the size and CRC32 the
  // manifests list are taken on the way.
  written_file out;
  std::uint32_t crc = crc32_of(nullptr, 0);
  int write_error = 0;
  const byte_sink sink = [&](const char* data, std::size_t size) {
    crc = crc32_update(crc, data, size);
    out.bytes += static_cast<std::int64_t>(size);
    while (size > 0) {
      const ssize_t n = ::write(fd, data, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        write_error = errno;
        throw std::system_error(errno, std::generic_category(), "write");
      }
      data += n;
      size -= static_cast<std::size_t>(n);
    }
  };
  try {
    produce(sink);
  } catch (...) {
    if (write_error == 0) {  // the producer's own error: the file is dropped, the error kept
      ::close(fd);
      ::unlink(temporary.c_str());
      throw;
    }
    errno = write_error;
    abandon("write failed");
  }
  out.crc32 = crc;
  if (::fsync(fd) != 0) abandon("fsync failed");
  if (::close(fd) != 0) {
    ::unlink(temporary.c_str());
    fail_checkpoint(path, "close failed");
  }
  if (::rename(temporary.c_str(), target.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temporary.c_str());
    fail_checkpoint(path, std::string("rename failed (") + std::strerror(saved) + ")");
  }
  // Make the rename itself durable.
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return out;
}
}  // namespace detail

detail::written_file detail::write_entries(const std::string& path, const c10::impl::GenericDict& entries,
                                           const deferred_tensors* deferred) {
  std::function<at::Tensor(const at::Tensor&)> materialize;
  if (deferred != nullptr) materialize = [deferred](const at::Tensor& stored) { return deferred->materialize(stored); };
  return write_file_atomically(path, [&](const byte_sink& sink) { write_torch_archive(entries, sink, materialize); });
}

at::Tensor detail::deferred_tensors::stand_in(const std::vector<std::int64_t>& shape, at::ScalarType dtype,
                                              std::function<at::Tensor()> make) {
  std::int64_t numel = 1;
  for (const std::int64_t d : shape) numel *= d;
  const auto options = at::TensorOptions().dtype(dtype);
  // A storage of the whole tensor's size over no memory: the pickle reads
  // its size, never its bytes, and the writer asks materialize for them.
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<std::size_t>(numel) * c10::elementSize(dtype),
                       c10::DataPtr(nullptr, c10::Device(c10::kCPU)), /*allocator=*/nullptr, /*resizable=*/false);
  at::Tensor tensor = at::empty({0}, options);
  tensor.set_(storage, 0, shape, c10::contiguous_strides(shape));
  makers_.emplace(tensor.storage().unsafeGetStorageImpl(), std::move(make));
  return tensor;
}

at::Tensor detail::deferred_tensors::materialize(const at::Tensor& stored) const {
  const auto found = makers_.find(stored.storage().unsafeGetStorageImpl());
  return found == makers_.end() ? stored : found->second().contiguous();
}

void write_file_atomically(const std::string& path, const std::vector<char>& bytes) {
  detail::write_file_atomically(path, [&](const detail::byte_sink& sink) { sink(bytes.data(), bytes.size()); });
}

void publish_directory(const std::string& staged, const std::string& path) {
  std::error_code ec;
  if (!fs::exists(staged, ec)) fail_checkpoint(path, "cannot be published from " + staged + ", which does not exist");
  const fs::path target = fs::absolute(path);
  const bool replacing = fs::exists(target, ec) || fs::is_symlink(target, ec);
  const int status = replacing ? ::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE)
                               : ::rename(staged.c_str(), target.c_str());
  if (status != 0) {
    fail_checkpoint(path, std::string(replacing ? "cannot be exchanged with " : "cannot be renamed from ") + staged + " (" +
                   std::strerror(errno) + "); the previous checkpoint, if any, is untouched");
  }
  // Make the exchange durable before the old one goes.
  const int dir_fd = ::open(target.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  if (replacing) fs::remove_all(staged, ec);  // now the old checkpoint; a leftover is harmless
}

namespace detail {
c10::impl::GenericDict checkpoint_entries(const std::string& path, const state& state, const state_filter& filter,
                                          const checkpoint_metadata& metadata) {
  return checkpoint_entries(path, state, filter, metadata, state);
}
c10::impl::GenericDict checkpoint_entries(const std::string& path, const state& state, const state_filter& filter,
                                          const checkpoint_metadata& metadata, const loom::state& names_from) {
  for (const auto& [name, function] : filter) {
    const auto* entry = state.find(name);
    if (entry == nullptr) {
      fail_checkpoint(path, "filter names '" + name + "', which is not in the state (entries: " + join(state.names()) + ")");
    }
    if (entry->io().kind() != "module") {
      fail_checkpoint(path, "filter names '" + name + "', a " + std::string(entry->io().kind()) +
                     "; filters apply to modules (their state-dict items)");
    }
  }
  c10::impl::GenericDict entries(c10::StringType::get(), c10::AnyType::get());
  checkpoint_metadata described = metadata;
  for (const auto& entry : state.entries()) {
    if (std::string type = entry.io().type_name(); !type.empty()) described.optimizer_types[entry.name()] = type;
  }
  entries.insert(metadata_key, metadata_value(described));
  const detail::parameter_names names = names_of(names_from);
  for (const auto& entry : state.entries()) {
    if (entry.name() == metadata_key) fail_checkpoint(path, std::string("'") + metadata_key + "' is reserved for loom");
    auto it = filter.find(entry.name());
    entries.insert(entry.name(), entry.io().save(it == filter.end() ? nullptr : &it->second, names));
  }
  return entries;
}
}  // namespace detail

void save_checkpoint(const std::string& path, const state& state, const state_filter& filter,
                     const checkpoint_metadata& metadata) {
  detail::write_entries(path, detail::checkpoint_entries(path, state, filter, metadata));
}

void save_gathered_checkpoint(const std::string& path, const state& state, const state_filter& filter,
                              const checkpoint_metadata& metadata, const rank_parts& mine,
                              const std::function<at::Tensor(const std::string& name, const at::Tensor& part)>& gather,
                              bool writes) {
  checkpoint_contents own;
  own.entries = detail::checkpoint_entries(path, state, filter, metadata);
  detail::deferred_tensors deferred;
  // One stand-in per part: a tied weight is one tensor under two names (one record, one gather).
  std::unordered_map<const void*, at::Tensor> stand_ins;
  const c10::impl::GenericDict entries = detail::rebuild_split_tensors(
      own.entries,
      [&](const std::string& name, const c10::IValue& value, detail::split_place place) {
        auto part = mine.find(name);
        if (part == mine.end() || !value.isTensor()) return false;
        // The parameter's part, or a per-parameter state tensor of the same
        // elements (not a scalar such as step): alike on every rank.
        const at::Tensor& t = value.toTensor();
        return place == detail::split_place::state_dict ||
               (t.dim() > 0 && t.numel() == part->second.range.end - part->second.range.begin);
      },
      [&](const detail::split_site& site, const std::string& /*what*/,
          const detail::tensor_finder& find) -> c10::IValue {
        const at::Tensor part = find(own).toTensor();
        auto [found, fresh] = stand_ins.try_emplace(part.unsafeGetTensorImpl());
        if (fresh) {
          found->second = deferred.stand_in(mine.at(site.name).range.shape, part.scalar_type(),
                                            [&gather, name = site.name, part] { return gather(name, part); });
        }
        return found->second;
      });
  const auto materialize = [&deferred](const at::Tensor& stored) { return deferred.materialize(stored); };
  if (writes) {
    detail::write_entries(path, entries, &deferred);
  } else {
    // The same records in the same order, so the same gathers; the bytes go nowhere.
    detail::write_torch_archive(entries, [](const char*, std::size_t) {}, materialize);
  }
}

detail::written_file detail::write_contents(const std::string& path, const checkpoint_contents& contents,
                                            const deferred_tensors* deferred) {
  // The metadata first, then the entries.
  c10::impl::GenericDict entries(c10::StringType::get(), c10::AnyType::get());
  entries.insert(metadata_key, detail::metadata_value(contents.metadata));
  for (const auto& item : contents.entries) {
    if (item.key().toStringRef() != metadata_key) entries.insert(item.key(), item.value());
  }
  return write_entries(path, entries, deferred);
}

void write_checkpoint(const std::string& path, const checkpoint_contents& contents) {
  detail::write_contents(path, contents);
}

namespace {

// Format 1 (loom before the torch.load-readable files): a 24-byte header
// ("LOOMCKPT", version, payload length, CRC32) before a torch::pickle_save archive.
c10::IValue read_format_1(const std::vector<char>& bytes, const std::string& path) {
  static std::atomic<bool> told{false};
  if (!told.exchange(true)) {
    std::cerr << "loom: " << path << " is in loom's earlier checkpoint format (1); it loads, and the next save "
              << "writes the current one, which Python's torch.load reads" << std::endl;
  }
  constexpr std::size_t header_size = 24;
  if (bytes.size() < header_size) fail_checkpoint(path, "is truncated (shorter than the header)");
  const std::uint64_t length = little_endian(bytes.data() + 12, 8);
  const auto crc = static_cast<std::uint32_t>(little_endian(bytes.data() + 20, 4));
  if (bytes.size() - header_size != length) {
    fail_checkpoint(path, "is truncated or padded: the header declares " + std::to_string(length) + " payload bytes, the file has " +
                   std::to_string(bytes.size() - header_size));
  }
  if (!detail::crc_matches(bytes.data() + header_size, length, crc)) fail_checkpoint(path, "is corrupted (CRC32 mismatch)");
  // The payload is a torch::pickle_save archive: the same zip and pickle as
  // format 2, so the same checks (LibTorch's pickle_load would make none).
  return detail::read_torch_archive(std::span<const char>(bytes).subspan(header_size), path);
}

}  // namespace

checkpoint_contents read_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    fail_checkpoint(path, "is a directory, not a checkpoint file (a sharded checkpoint loads with load_checkpoint, "
                          "or becomes one file with loom-run consolidate)");
  }
  if (!fs::exists(path, ec)) fail_checkpoint(path, "does not exist");
  return detail::parse_checkpoint(read_file(path), path);
}

checkpoint_contents detail::parse_checkpoint(const std::vector<char>& bytes, const std::string& path) {
  return parse_checkpoint(std::span<const char>(bytes), path, nullptr);
}

checkpoint_contents detail::parse_checkpoint(std::span<const char> bytes, const std::string& path,
                                             std::shared_ptr<const void> backing, unread_records* unread) {
  c10::IValue root;
  if (bytes.size() >= sizeof(magic) && std::memcmp(bytes.data(), magic, sizeof(magic)) == 0) {
    root = read_format_1(std::vector<char>(bytes.begin(), bytes.end()), path);
  } else if (bytes.size() >= 2 && bytes[0] == 'P' && bytes[1] == 'K') {
    structure_budget budget;
    root = unread != nullptr ? detail::read_torch_archive_structure(bytes, path, budget, std::move(backing), *unread)
                             : detail::read_torch_archive(bytes, path, budget, std::move(backing));
  } else {
    fail_checkpoint(path, bytes.size() < 22 ? "is truncated (shorter than a zip directory)"
                                 : "is not a loom checkpoint (neither a torch zip archive nor loom's earlier format)");
  }
  if (!root.isGenericDict()) fail_checkpoint(path, "does not hold a dict of entries (found " + root.tagKind() + ")");
  checkpoint_contents contents;
  contents.entries = root.toGenericDict();
  for (const auto& item : contents.entries) {
    if (!item.key().isString()) fail_checkpoint(path, "holds a dict whose keys are not all strings");
  }
  auto meta = contents.entries.find(metadata_key);
  // A dict Python's torch.save wrote has no metadata: it loads as written by one process.
  if (meta == contents.entries.end()) return contents;
  if (!meta->value().isGenericDict()) fail_checkpoint(path, std::string("has a '") + metadata_key + "' entry that is not loom's metadata");
  const auto dict = meta->value().toGenericDict();
  auto get = [&](const char* key) {
    auto it = dict.find(key);
    if (it == dict.end()) fail_checkpoint(path, std::string("metadata lacks '") + key + "'");
    return it->value();
  };
  const std::int64_t version = get("format_version").toInt();
  if (version > checkpoint_format_version) {
    fail_checkpoint(path, "has format version " + std::to_string(version) + ", newer than this loom reads (" +
                   std::to_string(checkpoint_format_version) + ")");
  }
  contents.metadata.world_size = get("world_size").toInt();
  contents.metadata.global_rank = get("global_rank").toInt();
  contents.metadata.strategy = get("strategy").toStringRef();
  contents.metadata.precision = get("precision").toStringRef();
  if (auto types = dict.find("optimizer_types"); types != dict.end() && types->value().isGenericDict()) {
    for (const auto& item : types->value().toGenericDict()) {
      contents.metadata.optimizer_types[item.key().toStringRef()] = item.value().toStringRef();
    }
  }
  if (auto shards = dict.find("shards"); shards != dict.end() && shards->value().isGenericDict()) {
    for (const auto& item : shards->value().toGenericDict()) {
      if (!item.value().isList() || item.value().toListRef().size() < 2) {
        fail_checkpoint(path, "has a malformed shard range for '" + item.key().toStringRef() + "'");
      }
      const auto& list = item.value().toListRef();
      shard_range range{list[0].toInt(), list[1].toInt(), {}};
      for (std::size_t d = 2; d < list.size(); ++d) range.shape.push_back(list[d].toInt());
      contents.metadata.shards[item.key().toStringRef()] = range;
    }
  }
  if (auto chunks = dict.find("tensor_parallel"); chunks != dict.end() && chunks->value().isGenericDict()) {
    for (const auto& item : chunks->value().toGenericDict()) {
      auto range = contents.metadata.shards.find(item.key().toStringRef());
      if (range == contents.metadata.shards.end() || !item.value().isList() || item.value().toListRef().size() != 3) {
        fail_checkpoint(path, "has a malformed tensor-parallel chunk for '" + item.key().toStringRef() + "'");
      }
      const auto& list = item.value().toListRef();
      range->second.dim = list[0].toInt();
      range->second.part = list[1].toInt();
      range->second.parts = list[2].toInt();
    }
  }
  for (const auto& [name, range] : contents.metadata.shards) check_range(range, name, path);
  (void)contents.entries.erase(metadata_key);
  return contents;
}

namespace {

// 1. Every entry of target checked against contents; nothing changes.
void validate_contents(const std::string& path, const checkpoint_contents& contents, const state& target, bool strict,
                       const detail::parameter_names& names) {
  std::vector<std::string> problems;
  std::vector<std::string> missing;
  for (const auto& entry : target.entries()) {
    auto it = contents.entries.find(entry.name());
    if (it == contents.entries.end()) {
      if (entry.required()) missing.push_back(entry.name());
      continue;
    }
    const std::string type = entry.io().type_name();
    auto saved_type = contents.metadata.optimizer_types.find(entry.name());
    if (!type.empty() && saved_type != contents.metadata.optimizer_types.end() && saved_type->second != type) {
      problems.push_back("'" + entry.name() + "' (" + std::string(entry.io().kind()) + "): it holds the state of a " +
                         saved_type->second + ", but the optimizer is a " + type);
      continue;
    }
    std::string problem = entry.io().validate(it->value(), strict, names);
    if (!problem.empty()) problems.push_back("'" + entry.name() + "' (" + std::string(entry.io().kind()) + "): " + problem);
  }
  if (strict && !missing.empty()) {
    std::vector<std::string> present;
    for (const auto& item : contents.entries) present.push_back(item.key().toStringRef());
    problems.insert(problems.begin(), "missing key(s) " + join(missing) + " (the checkpoint has " + join(present) +
                                          "; pass strict=false to load the others)");
  }
  if (!problems.empty()) {
    std::string message = "cannot be loaded, nothing was changed: ";
    for (std::size_t i = 0; i < problems.size(); ++i) message += (i ? "; " : "") + problems[i];
    fail_checkpoint(path, message);
  }
}

// 2. and 3.: contents (validated) loaded into target; the entries target did
// not ask for returned.
state apply_contents(const std::string& path, const checkpoint_contents& contents, const state& target, bool strict,
                     const detail::parameter_names& names) {
  // 2. Entries whose load can still fail go first, each after a snapshot.
  std::vector<std::pair<detail::entry_io*, c10::IValue>> undo;
  for (const auto& entry : target.entries()) {
    auto it = contents.entries.find(entry.name());
    if (it == contents.entries.end() || !entry.io().fallible_load()) continue;
    c10::IValue before = entry.io().snapshot(names);
    try {
      entry.io().load(it->value(), strict, names);
    } catch (const std::exception& error) {
      // Put back this entry (it may be half-loaded) and those loaded before it.
      // Each on its own: one that cannot be put back must not stop the others.
      undo.emplace_back(&entry.io(), std::move(before));
      for (auto& [io, value] : undo) {
        try {
          io->load(value, false, names);
        } catch (...) {
        }
      }
      fail_checkpoint(path, "cannot load '" + entry.name() + "' (" + std::string(entry.io().kind()) + "): " + error.what() +
                     "; nothing was changed");
    }
    undo.emplace_back(&entry.io(), std::move(before));
  }
  // 3. The rest were validated and cannot fail.
  for (const auto& entry : target.entries()) {
    auto it = contents.entries.find(entry.name());
    if (it == contents.entries.end() || entry.io().fallible_load()) continue;
    entry.io().load(it->value(), strict, names);
  }

  state remainder;
  for (const auto& item : contents.entries) {
    const auto& name = item.key().toStringRef();
    if (!target.contains(name)) remainder.add(state_entry(name, item.value()));
  }
  return remainder;
}

// Every rank learns whether every rank read and validated its part; a
// failure anywhere throws on every rank (a failed rank its own error), so
// no rank loads unless all do.
void agree_to_load(const std::string& path, const std::exception_ptr& failure, comm::process_group& group) {
  if (!group.valid() || group.size() == 1) {
    if (failure) std::rethrow_exception(failure);
    return;
  }
  const at::Tensor mine = at::full({1}, failure ? 1 : 0, at::TensorOptions().dtype(at::kLong)).to(group.device());
  const at::Tensor everyone = group.all_gather_stacked(mine).to(at::kCPU).reshape({-1});
  if (failure) std::rethrow_exception(failure);
  std::string failed;
  for (std::int64_t r = 0; r < everyone.numel(); ++r) {
    if (everyone[r].item<std::int64_t>() != 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!failed.empty()) {
    fail_checkpoint(path, "rank(s) " + failed + " could not read or check their part of it (their errors say "
                          "why); nothing was changed on any rank");
  }
}

}  // namespace

state load_checkpoint(const std::string& path, const state& target, bool strict) {
  // A directory is a sharded checkpoint, or ZeRO's in DeepSpeed's layout (with 'latest'); the readers say what
  // is missing when it is neither.
  std::error_code ec;
  const checkpoint_contents contents = !fs::is_directory(path, ec)    ? read_checkpoint(path)
                                       : is_deepspeed_checkpoint(path) ? read_deepspeed_checkpoint(path)
                                                                       : read_sharded_checkpoint(path);
  const detail::parameter_names names = names_of(target);
  validate_contents(path, contents, target, strict, names);
  return apply_contents(path, contents, target, strict, names);
}

namespace {

// The live tensors a load of target's parts reads into: each module's
// parameters named in mine (their data is this rank's part), and each
// optimizer's per-parameter state of them, by (entry, name, field).
using live_tensors = std::map<std::tuple<std::string, std::string, std::string>, at::Tensor>;
live_tensors live_parts(const state& target, const rank_parts& mine, const detail::parameter_names& names) {
  live_tensors live;
  for (const auto& entry : target.entries()) {
    if (const torch::nn::Module* module = entry.io().module()) {
      for (const auto& item : module->named_parameters()) {
        if (mine.count(item.key())) live[{entry.name(), item.key(), ""}] = item.value().detach();
      }
    } else if (torch::optim::Optimizer* optimizer = entry.io().optimizer()) {
      detail::for_each_state_tensor(*optimizer, [&](const at::Tensor& parameter, std::string_view field,
                                                     at::Tensor& value) {
        const auto name = names.name_of(parameter);
        if (name && mine.count(*name) && value.defined()) live[{entry.name(), *name, std::string(field)}] = value;
      });
    }
  }
  return live;
}

}  // namespace

state load_local_parts(const std::string& path, const state& target, const rank_parts& mine, bool strict,
                       comm::process_group& group) {
  // The parameters' names, once for the three passes below.
  const detail::parameter_names names = names_of(target);
  std::exception_ptr failure;
  try {
    const checkpoint_contents checked = read_local_parts(path, mine, {.verify_only = true});
    validate_contents(path, checked, target, strict, names);
  } catch (...) {
    failure = std::current_exception();
  }
  agree_to_load(path, failure, group);
  const live_tensors live = live_parts(target, mine, names);
  local_read into_live;
  into_live.into = [&live](const std::string& entry, const std::string& name, const std::string& field) {
    auto found = live.find({entry, name, field});
    return found == live.end() ? at::Tensor() : found->second;
  };
  checkpoint_contents contents;
  try {
    contents = read_local_parts(path, mine, into_live);
  } catch (const checkpoint_error& error) {
    throw checkpoint_error(std::string(error.what()) + " (on the second read: it was checked whole before the "
                           "load, so it changed meanwhile, and this rank's state is partly loaded; load again)");
  }
  return apply_contents(path, contents, target, strict, names);
}

// ---------------------------------------------------------------------------
// Raw state dicts
// ---------------------------------------------------------------------------
namespace {

// Reads the parameters and buffers a LibTorch module archive holds for module.
void read_module_archive(torch::serialize::InputArchive& archive, const torch::nn::Module& module,
                         const std::string& prefix, std::map<std::string, at::Tensor>& found,
                         std::vector<std::string>& unexpected) {
  std::vector<std::string> expected;
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    expected.push_back(item.key());
    at::Tensor value;
    if (archive.try_read(item.key(), value)) found[prefix + item.key()] = value;
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    expected.push_back(item.key());
    at::Tensor value;
    if (archive.try_read(item.key(), value, /*is_buffer=*/true)) found[prefix + item.key()] = value;
  }
  for (const auto& child : module.named_children()) {
    expected.push_back(child.key());
    torch::serialize::InputArchive child_archive;
    if (archive.try_read(child.key(), child_archive)) {
      read_module_archive(child_archive, *child.value(), prefix + child.key() + ".", found, unexpected);
    }
  }
  for (const auto& key : archive.keys()) {
    if (std::find(expected.begin(), expected.end(), key) == expected.end()) unexpected.push_back(prefix + key);
  }
}

void apply_state_dict(const std::string& path, torch::nn::Module& module, const std::map<std::string, at::Tensor>& found,
                      std::vector<std::string> unexpected, bool strict) {
  std::vector<std::string> missing;
  std::vector<std::string> problems;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  auto consider = [&](const std::string& key, const at::Tensor& target) {
    auto it = found.find(key);
    if (it == found.end()) {
      missing.push_back(key);
      return;
    }
    if (it->second.sizes() != target.sizes()) {
      std::ostringstream out;
      out << "size mismatch for '" << key << "': the file has shape " << it->second.sizes() << ", the module has "
          << target.sizes();
      problems.push_back(out.str());
      return;
    }
    copies.emplace_back(target, it->second);
  };
  std::vector<std::string> known;
  for (const auto& item : module.named_parameters(true)) {
    known.push_back(item.key());
    consider(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(true)) {
    known.push_back(item.key());
    consider(item.key(), item.value());
  }
  for (const auto& [key, value] : found) {
    if (std::find(known.begin(), known.end(), key) == known.end() &&
        std::find(unexpected.begin(), unexpected.end(), key) == unexpected.end()) {
      unexpected.push_back(key);
    }
  }
  if (strict && !missing.empty()) problems.insert(problems.begin(), "missing key(s) " + join(missing));
  if (strict && !unexpected.empty()) problems.push_back("unexpected key(s) " + join(unexpected));
  if (!problems.empty()) {
    std::string message = "cannot be loaded into the module, nothing was changed: ";
    for (std::size_t i = 0; i < problems.size(); ++i) message += (i ? "; " : "") + problems[i];
    fail_checkpoint(path, message);
  }
  at::NoGradGuard no_grad;
  for (auto& [target, value] : copies) target.copy_(value);
}

std::vector<char> read_zip_or_fail(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail_checkpoint(path, "does not exist");
  std::vector<char> bytes = read_file(path);
  if (bytes.size() >= sizeof(magic) && std::memcmp(bytes.data(), magic, sizeof(magic)) == 0) {
    fail_checkpoint(path, "is a loom checkpoint; read it with fabric.load(path, state)");
  }
  if (bytes.size() < 4 || bytes[0] != 'P' || bytes[1] != 'K') {
    fail_checkpoint(path, "is not a torch zip archive (written by torch::save, or by Python's torch.save since 1.6); "
               "files from _use_new_zipfile_serialization=False are not supported");
  }
  return bytes;
}

}  // namespace

void load_raw_module(const std::string& path, torch::nn::Module& module, bool strict) {
  const std::vector<char> bytes = read_zip_or_fail(path);
  std::map<std::string, at::Tensor> found;
  std::vector<std::string> unexpected;
  bool torchscript = false;
  try {
    torchscript = detail::is_libtorch_archive(bytes);
  } catch (const checkpoint_error&) {
    throw;
  } catch (const std::exception& error) {
    fail_checkpoint(path, std::string("cannot be read as a torch archive: ") + error.what());
  }

  if (torchscript) {
    // torch::save(module, path): a LibTorch archive, one sub-archive per child.
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      read_module_archive(archive, module, "", found, unexpected);
    } catch (const std::exception& error) {
      fail_checkpoint(path, std::string("cannot be read as a LibTorch module archive: ") + error.what());
    }
  } else {
    const c10::IValue value = detail::read_torch_archive(bytes, path);
    if (!value.isGenericDict()) fail_checkpoint(path, "does not hold a dict of tensors (found " + value.tagKind() + ")");
    if (value.toGenericDict().contains(metadata_key)) fail_checkpoint(path, "is a loom checkpoint; read it with fabric.load(path, state)");
    for (const auto& item : value.toGenericDict()) {
      if (!item.key().isString() || !item.value().isTensor()) {
        fail_checkpoint(path, "holds a dict whose entries are not all name -> tensor");
      }
      found[item.key().toStringRef()] = item.value().toTensor();
    }
  }
  apply_state_dict(path, module, found, std::move(unexpected), strict);
}

void load_raw_optimizer(const std::string& path, torch::optim::Optimizer& optimizer) {
  const std::vector<char> bytes = read_zip_or_fail(path);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size());
  } catch (const std::exception& error) {
    fail_checkpoint(path, std::string("is not a LibTorch optimizer archive (written by torch::save(optimizer, path)); Python "
                           "optimizer state dicts have no LibTorch equivalent: ") +
                   error.what());
  }
  // Snapshot, so a mismatching archive leaves the optimizer as it was.
  torch::serialize::OutputArchive before;
  optimizer.save(before);
  std::ostringstream snapshot;
  before.save_to(snapshot);
  try {
    optimizer.load(archive);
  } catch (const std::exception& error) {
    const std::string bytes_before = snapshot.str();
    torch::serialize::InputArchive restore;
    restore.load_from(bytes_before.data(), bytes_before.size());
    optimizer.load(restore);
    fail_checkpoint(path, std::string("does not fit this optimizer, nothing was changed: ") + error.what());
  }
}

}  // namespace loom
