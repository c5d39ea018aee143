// Writing and reading torch zip archives for checkpoints (torch_archive.hpp).
#include "torch_archive.hpp"
#include "file_bytes.hpp"

#include "python_pickle.hpp"

#include <loom/errors.hpp>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstring>
#include <memory>

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

std::vector<char> write_torch_archive(const c10::IValue& root) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&pickle](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(generic(root));
  pickler.stop();

  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&archive](const void* data, size_t size) {
    const auto* first = static_cast<const char*>(data);
    archive.insert(archive.end(), first, first + size);
    return size;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  // As PyTorch 2.x writes it, so its torch.load need not guess.
  static constexpr char byteorder[] = "little";
  writer.writeRecord("byteorder", byteorder, sizeof(byteorder) - 1);
  const std::vector<at::Tensor>& storages = pickler.tensorData();
  for (std::size_t i = 0; i < storages.size(); ++i) {
    const auto data = torch::jit::getWriteableTensorData(storages[i]);
    writer.writeRecord("data/" + std::to_string(i), data.data(), data.sizeInBytes());
  }
  writer.writeEndOfFile();
  return archive;
}

void verify_zip_records(const std::vector<char>& bytes, const std::string& path) {
  const char* data = bytes.data();
  const std::size_t size = bytes.size();
  // End of central directory: 22 bytes plus a comment of at most 64 KiB, at the end.
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
  std::uint64_t entries = little_endian(data + eocd + 10, 2);
  std::uint64_t directory_size = little_endian(data + eocd + 12, 4);
  std::uint64_t directory_offset = little_endian(data + eocd + 16, 4);
  if (entries == 0xFFFF || directory_size == 0xFFFFFFFF || directory_offset == 0xFFFFFFFF) {
    // ZIP64: the locator sits just before the end record and points at the ZIP64 end record.
    if (eocd < 20 || little_endian(data + eocd - 20, 4) != 0x07064b50) fail_checkpoint(path, "has a damaged ZIP64 directory");
    const std::uint64_t record = little_endian(data + eocd - 20 + 8, 8);
    if (record + 56 > size || little_endian(data + record, 4) != 0x06064b50) fail_checkpoint(path, "has a damaged ZIP64 directory");
    entries = little_endian(data + record + 32, 8);
    directory_size = little_endian(data + record + 40, 8);
    directory_offset = little_endian(data + record + 48, 8);
  }
  if (directory_offset + directory_size > size) fail_checkpoint(path, "is truncated (its zip directory points past the end)");

  std::size_t at = directory_offset;
  for (std::uint64_t i = 0; i < entries; ++i) {
    if (at + 46 > size || little_endian(data + at, 4) != 0x02014b50) fail_checkpoint(path, "has a damaged zip directory");
    const auto method = little_endian(data + at + 10, 2);
    const auto crc = static_cast<std::uint32_t>(little_endian(data + at + 16, 4));
    std::uint64_t compressed = little_endian(data + at + 20, 4);
    std::uint64_t uncompressed = little_endian(data + at + 24, 4);
    const std::size_t name_length = little_endian(data + at + 28, 2);
    const std::size_t extra_length = little_endian(data + at + 30, 2);
    const std::size_t comment_length = little_endian(data + at + 32, 2);
    std::uint64_t local = little_endian(data + at + 42, 4);
    if (at + 46 + name_length + extra_length + comment_length > size) fail_checkpoint(path, "has a damaged zip directory");
    const std::string name(data + at + 46, name_length);
    // ZIP64 extended information: the 0xFFFFFFFF fields, in this order.
    for (std::size_t extra = at + 46 + name_length, end = extra + extra_length; extra + 4 <= end;) {
      const auto id = little_endian(data + extra, 2);
      const std::size_t length = little_endian(data + extra + 2, 2);
      if (id == 0x0001) {
        std::size_t field = extra + 4;
        if (uncompressed == 0xFFFFFFFF) uncompressed = little_endian(data + field, 8), field += 8;
        if (compressed == 0xFFFFFFFF) compressed = little_endian(data + field, 8), field += 8;
        if (local == 0xFFFFFFFF) local = little_endian(data + field, 8);
      }
      extra += 4 + length;
    }
    if (method != 0 || compressed != uncompressed) {
      fail_checkpoint(path, "holds a compressed record '" + name + "'; torch archives store their records uncompressed");
    }
    if (local + 30 > size || little_endian(data + local, 4) != 0x04034b50) {
      fail_checkpoint(path, "is truncated or damaged (record '" + name + "' has no local header)");
    }
    const std::uint64_t start = local + 30 + little_endian(data + local + 26, 2) + little_endian(data + local + 28, 2);
    if (start + compressed > size) fail_checkpoint(path, "is truncated (record '" + name + "' runs past the end of the file)");
    if (crc32_of(data + start, compressed) != crc) fail_checkpoint(path, "is corrupted (CRC32 mismatch) in record '" + name + "'");
    at += 46 + name_length + extra_length + comment_length;
  }
}

c10::IValue read_torch_archive(const std::vector<char>& bytes, const std::string& path) {
  verify_zip_records(bytes, path);
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<vector_adapter>(bytes));
    if (reader.hasRecord("constants.pkl")) {
      fail_checkpoint(path, "is a LibTorch archive (torch::save(module or optimizer, path)), not a checkpoint; read it with "
                 "fabric.load_raw");
    }
    if (!reader.hasRecord("data.pkl")) fail_checkpoint(path, "is a zip archive without data.pkl: not a torch file");
    auto [pickle_data, pickle_size] = reader.getRecord("data.pkl");
    const auto* first = static_cast<const char*>(pickle_data.get());
    pickle_fixup fixed;
    try {
      fixed = fix_python_pickle(std::vector<char>(first, first + pickle_size));
    } catch (const std::runtime_error& error) {
      fail_checkpoint(path, std::string("cannot be decoded: ") + error.what());
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
    std::size_t position = 0;
    auto read = [&fixed, &position](char* buffer, size_t length) -> size_t {
      const size_t count = std::min(length, fixed.pickle.size() - position);
      std::memcpy(buffer, fixed.pickle.data() + position, count);
      position += count;
      return count;
    };
    auto read_record = [&reader](const std::string& name) { return std::get<0>(reader.getRecord("data/" + name)); };
    torch::jit::Unpickler unpickler(read, /*type_resolver=*/nullptr, /*obj_loader=*/nullptr, read_record,
                                    /*device=*/c10::nullopt);
    unpickler.set_version(reader.version());
    return unpickler.parse_ivalue();
  } catch (const checkpoint_error&) {
    throw;
  } catch (const std::exception& error) {
    fail_checkpoint(path, std::string("cannot be decoded: ") + error.what());
  }
}

}  // namespace loom::detail
