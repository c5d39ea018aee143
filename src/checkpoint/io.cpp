// Checkpoint files: atomic writes, verified reads, all-or-nothing loads, and
// state dicts written by LibTorch or Python.
#include <loom/checkpoint/io.hpp>
#include <loom/errors.hpp>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <zlib.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace loom {
namespace fs = std::filesystem;

namespace {

constexpr char magic[8] = {'L', 'O', 'O', 'M', 'C', 'K', 'P', 'T'};
constexpr const char* metadata_key = "__loom__";

void put_le(char* out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xFF);
}

std::uint64_t get_le(const char* data, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= std::uint64_t{static_cast<unsigned char>(data[i])} << (8 * i);
  return value;
}

std::uint32_t crc32_of(const char* data, std::size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(size, 1U << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    size -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw checkpoint_error("checkpoint " + path + ": " + why);
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open it (") + std::strerror(errno) + ")");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(path, "read error");
  return bytes;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + ("'" + item + "'");
  return out;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::vector<char>& bytes) {
  static std::atomic<unsigned> counter{0};
  const fs::path target = fs::absolute(path);
  const fs::path directory = target.parent_path();
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec) fail(path, "cannot create directory " + directory.string() + " (" + ec.message() + ")");
  const fs::path temporary =
      directory / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                   std::to_string(counter.fetch_add(1)));

  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot create " + temporary.string() + " (" + std::strerror(errno) + ")");
  auto abandon = [&](const std::string& why) {
    const int saved = errno;
    ::close(fd);
    ::unlink(temporary.c_str());
    fail(path, why + " (" + std::strerror(saved) + "); the previous file, if any, is untouched");
  };
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      abandon("write failed");
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) abandon("fsync failed");
  if (::close(fd) != 0) {
    ::unlink(temporary.c_str());
    fail(path, "close failed");
  }
  if (::rename(temporary.c_str(), target.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temporary.c_str());
    fail(path, std::string("rename failed (") + std::strerror(saved) + ")");
  }
  // Make the rename itself durable.
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void save_checkpoint(const std::string& path, const state& state, const state_filter& filter,
                     const checkpoint_metadata& metadata) {
  for (const auto& [name, function] : filter) {
    const auto* entry = state.find(name);
    if (entry == nullptr) {
      fail(path, "filter names '" + name + "', which is not in the state (entries: " + join(state.names()) + ")");
    }
    if (entry->io().kind() != "module") {
      fail(path, "filter names '" + name + "', a " + std::string(entry->io().kind()) +
                     "; filters apply to modules (their state-dict items)");
    }
  }
  c10::impl::GenericDict entries(c10::StringType::get(), c10::AnyType::get());
  c10::impl::GenericDict meta(c10::StringType::get(), c10::AnyType::get());
  meta.insert("format_version", checkpoint_format_version);
  meta.insert("world_size", metadata.world_size);
  meta.insert("global_rank", metadata.global_rank);
  meta.insert("strategy", metadata.strategy);
  meta.insert("precision", metadata.precision);
  entries.insert(metadata_key, meta);
  for (const auto& entry : state.entries()) {
    if (entry.name() == metadata_key) fail(path, std::string("'") + metadata_key + "' is reserved for loom");
    auto it = filter.find(entry.name());
    entries.insert(entry.name(), entry.io().save(it == filter.end() ? nullptr : &it->second));
  }
  const std::vector<char> payload = torch::pickle_save(entries);

  std::vector<char> file(checkpoint_header_size + payload.size());
  std::memcpy(file.data(), magic, sizeof(magic));
  put_le(file.data() + 8, static_cast<std::uint64_t>(checkpoint_format_version), 4);
  put_le(file.data() + 12, payload.size(), 8);
  put_le(file.data() + 20, crc32_of(payload.data(), payload.size()), 4);
  std::memcpy(file.data() + checkpoint_header_size, payload.data(), payload.size());
  write_file_atomically(path, file);
}

checkpoint_contents read_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(path, "is a directory, not a checkpoint file");
  if (!fs::exists(path, ec)) fail(path, "does not exist");
  const std::vector<char> bytes = read_file(path);
  if (bytes.size() < checkpoint_header_size || std::memcmp(bytes.data(), magic, sizeof(magic)) != 0) {
    if (bytes.size() >= 2 && bytes[0] == 'P' && bytes[1] == 'K') {
      fail(path, "is a plain torch file, not a loom checkpoint; load state dicts written by torch::save or "
                 "Python's torch.save with fabric.load_raw");
    }
    fail(path, bytes.size() < checkpoint_header_size ? "is truncated (shorter than the header)"
                                                      : "is not a loom checkpoint (bad magic number)");
  }
  const auto version = static_cast<std::int64_t>(get_le(bytes.data() + 8, 4));
  if (version > checkpoint_format_version) {
    fail(path, "has format version " + std::to_string(version) + ", newer than this loom reads (" +
                   std::to_string(checkpoint_format_version) + ")");
  }
  const std::uint64_t length = get_le(bytes.data() + 12, 8);
  const auto crc = static_cast<std::uint32_t>(get_le(bytes.data() + 20, 4));
  if (bytes.size() - checkpoint_header_size != length) {
    fail(path, "is truncated or padded: the header declares " + std::to_string(length) + " payload bytes, the file has " +
                   std::to_string(bytes.size() - checkpoint_header_size));
  }
  if (crc32_of(bytes.data() + checkpoint_header_size, length) != crc) {
    fail(path, "is corrupted (CRC32 mismatch)");
  }
  c10::IValue root;
  try {
    root = torch::pickle_load(std::vector<char>(bytes.begin() + checkpoint_header_size, bytes.end()));
  } catch (const std::exception& error) {
    fail(path, std::string("cannot be decoded: ") + error.what());
  }
  if (!root.isGenericDict()) fail(path, "does not hold a dict of entries");
  checkpoint_contents contents;
  contents.entries = root.toGenericDict();
  auto meta = contents.entries.find(metadata_key);
  if (meta == contents.entries.end() || !meta->value().isGenericDict()) fail(path, "has no loom metadata");
  const auto dict = meta->value().toGenericDict();
  auto get = [&](const char* key) {
    auto it = dict.find(key);
    if (it == dict.end()) fail(path, std::string("metadata lacks '") + key + "'");
    return it->value();
  };
  contents.metadata.world_size = get("world_size").toInt();
  contents.metadata.global_rank = get("global_rank").toInt();
  contents.metadata.strategy = get("strategy").toStringRef();
  contents.metadata.precision = get("precision").toStringRef();
  (void)contents.entries.erase(metadata_key);
  return contents;
}

state load_checkpoint(const std::string& path, const state& target, bool strict) {
  checkpoint_contents contents = read_checkpoint(path);

  // 1. Validate everything; nothing changes yet.
  std::vector<std::string> problems;
  std::vector<std::string> missing;
  for (const auto& entry : target.entries()) {
    auto it = contents.entries.find(entry.name());
    if (it == contents.entries.end()) {
      if (entry.required()) missing.push_back(entry.name());
      continue;
    }
    std::string problem = entry.io().validate(it->value(), strict);
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
    fail(path, message);
  }

  // 2. Entries whose load can still fail go first, each after a snapshot.
  std::vector<std::pair<detail::entry_io*, c10::IValue>> undo;
  for (const auto& entry : target.entries()) {
    auto it = contents.entries.find(entry.name());
    if (it == contents.entries.end() || !entry.io().fallible_load()) continue;
    c10::IValue before = entry.io().snapshot();
    try {
      entry.io().load(it->value(), strict);
    } catch (const std::exception& error) {
      // Put back this entry (it may be half-loaded) and those loaded before it.
      try {
        entry.io().load(before, false);
        for (auto& [io, value] : undo) io->load(value, false);
      } catch (...) {
      }
      fail(path, "cannot load '" + entry.name() + "' (" + std::string(entry.io().kind()) + "): " + error.what() +
                     "; nothing was changed");
    }
    undo.emplace_back(&entry.io(), std::move(before));
  }
  // 3. The rest were validated and cannot fail.
  for (const auto& entry : target.entries()) {
    auto it = contents.entries.find(entry.name());
    if (it == contents.entries.end() || entry.io().fallible_load()) continue;
    entry.io().load(it->value(), strict);
  }

  state remainder;
  for (const auto& item : contents.entries) {
    const auto& name = item.key().toStringRef();
    if (!target.contains(name)) remainder.add(state_entry(name, item.value()));
  }
  return remainder;
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
    fail(path, message);
  }
  at::NoGradGuard no_grad;
  for (auto& [target, value] : copies) target.copy_(value);
}

// Python's torch.save(model.state_dict()) pickles a collections.OrderedDict,
// which LibTorch 1.13's unpickler cannot read (it crashes); look at the
// pickle's first object before the unpickler does. (Every tensor's rebuild
// arguments hold an empty OrderedDict too; the unpickler copes with those.)
bool pickles_ordered_dict(const std::vector<char>& pickle) {
  std::string_view rest(pickle.data(), pickle.size());
  if (rest.size() >= 2 && static_cast<unsigned char>(rest[0]) == 0x80) rest.remove_prefix(2);  // PROTO n
  if (!rest.empty() && static_cast<unsigned char>(rest[0]) == 0x95 && rest.size() >= 9) rest.remove_prefix(9);  // FRAME
  // Protocol 2: GLOBAL "collections\nOrderedDict\n"
  if (rest.starts_with("ccollections\nOrderedDict\n")) return true;
  // Protocol 4: SHORT_BINUNICODE "collections", SHORT_BINUNICODE "OrderedDict", (MEMOIZE), STACK_GLOBAL
  static constexpr std::string_view module_name = "\x8c\x0b" "collections";
  if (rest.starts_with(module_name)) {
    rest.remove_prefix(module_name.size());
    if (!rest.empty() && static_cast<unsigned char>(rest[0]) == 0x94) rest.remove_prefix(1);
    return rest.starts_with("\x8c\x0b" "OrderedDict");
  }
  return false;
}

std::vector<char> read_zip_or_fail(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "does not exist");
  std::vector<char> bytes = read_file(path);
  if (bytes.size() >= sizeof(magic) && std::memcmp(bytes.data(), magic, sizeof(magic)) == 0) {
    fail(path, "is a loom checkpoint; read it with fabric.load(path, state)");
  }
  if (bytes.size() < 4 || bytes[0] != 'P' || bytes[1] != 'K') {
    fail(path, "is not a torch zip archive (written by torch::save, or by Python's torch.save since 1.6); "
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
  std::vector<char> pickle;
  try {
    std::istringstream stream(std::string(bytes.begin(), bytes.end()));
    caffe2::serialize::PyTorchStreamReader reader(&stream);
    torchscript = reader.hasRecord("constants.pkl");
    if (!torchscript) {
      if (!reader.hasRecord("data.pkl")) fail(path, "is a zip archive without data.pkl: not a torch file");
      auto [data, size] = reader.getRecord("data.pkl");
      const auto* first = static_cast<const char*>(data.get());
      pickle.assign(first, first + size);
    }
  } catch (const checkpoint_error&) {
    throw;
  } catch (const std::exception& error) {
    fail(path, std::string("cannot be read as a torch archive: ") + error.what());
  }

  if (torchscript) {
    // torch::save(module, path): a LibTorch archive, one sub-archive per child.
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      read_module_archive(archive, module, "", found, unexpected);
    } catch (const std::exception& error) {
      fail(path, std::string("cannot be read as a LibTorch module archive: ") + error.what());
    }
  } else {
    if (pickles_ordered_dict(pickle)) {
      fail(path, "holds a Python collections.OrderedDict (what model.state_dict() returns), which LibTorch 1.13 "
                 "cannot unpickle. Save a plain dict instead: torch.save(dict(model.state_dict()), path)");
    }
    c10::IValue value;
    try {
      value = torch::pickle_load(bytes);
    } catch (const std::exception& error) {
      fail(path, std::string("cannot be unpickled: ") + error.what());
    }
    if (!value.isGenericDict()) fail(path, "does not hold a dict of tensors (found " + value.tagKind() + ")");
    for (const auto& item : value.toGenericDict()) {
      if (!item.key().isString() || !item.value().isTensor()) {
        fail(path, "holds a dict whose entries are not all name -> tensor");
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
    fail(path, std::string("is not a LibTorch optimizer archive (written by torch::save(optimizer, path)); Python "
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
    fail(path, std::string("does not fit this optimizer, nothing was changed: ") + error.what());
  }
}

}  // namespace loom
