#include <loom/data/idx.hpp>
#include <loom/errors.hpp>

#include "../util/outside_files.hpp"

#include <ATen/ATen.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

namespace loom::data {
namespace {

struct gz_closer {
  void operator()(gzFile file) const { gzclose(file); }
};

[[noreturn]] void fail(const std::string& path, const std::string& why, const std::string& hint) {
  std::string message = "cannot read IDX file " + path + ": " + why;
  if (!hint.empty()) message += ". " + hint;
  throw data_error(message);
}

void read_exact(gzFile file, void* out, std::size_t size, const std::string& path, const std::string& what,
                const std::string& hint) {
  auto* bytes = static_cast<unsigned char*>(out);
  std::size_t done = 0;
  while (done < size) {
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(size - done, 1U << 30));
    const int got = gzread(file, bytes + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      fail(path, "corrupt data while reading the " + what + " (" + message + ")", hint);
    }
    if (got == 0) {
      fail(path,
           "the file ends early: the " + what + " needs " + std::to_string(size) + " bytes, found " +
               std::to_string(done),
           hint);
    }
    done += static_cast<std::size_t>(got);
  }
}

[[noreturn]] void refuse_idx(const std::string& path, const std::string& why) {
  throw data_error("cannot read IDX file " + path + ": it " + why);
}

// DEFLATE's largest ratio (a run of one byte) is a little under 1032:1: a
// gzip file of S bytes cannot hold more than 1032 S bytes of data.
constexpr std::int64_t deflate_max_ratio = 1032;

}  // namespace

at::Tensor read_idx(const std::string& path, const std::string& hint) {
  // A regular file (a FIFO would block, /dev/zero never ends), then gzip or plain.
  const auto opened = loom::detail::open_regular_file(path, &refuse_idx);
  if (!opened) fail(path, std::strerror(ENOENT), hint);
  std::unique_ptr<gzFile_s, gz_closer> file(gzdopen(opened->descriptor, "rb"));
  if (!file) {
    ::close(opened->descriptor);
    fail(path, "cannot open it (out of memory)", hint);
  }

  std::array<unsigned char, 4> magic{};
  read_exact(file.get(), magic.data(), magic.size(), path, "header", hint);
  if (magic[0] != 0 || magic[1] != 0) fail(path, "it does not start with the IDX magic number (00 00 type dims)", hint);
  if (magic[2] != 0x08) {
    fail(path, "element type 0x" + std::to_string(magic[2]) + " is not supported (only unsigned bytes, 0x08)", hint);
  }
  const int dims = magic[3];
  if (dims < 1 || dims > 4) fail(path, "it declares " + std::to_string(dims) + " dimensions (1 to 4 accepted)", hint);

  std::vector<int64_t> shape(static_cast<std::size_t>(dims));
  int64_t count = 1;
  for (auto& extent : shape) {
    std::array<unsigned char, 4> be{};
    read_exact(file.get(), be.data(), be.size(), path, "header", hint);
    extent = (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) | (int64_t{be[2]} << 8) | int64_t{be[3]};
    if (extent <= 0 || extent > (int64_t{1} << 28)) fail(path, "a dimension of " + std::to_string(extent) + " is not plausible", hint);
    count *= extent;
    if (count > (int64_t{1} << 34)) fail(path, "the declared size is too large", hint);
  }

  // Nothing is allocated for more data than the file can hold.
  const auto file_bytes = static_cast<std::int64_t>(opened->bytes);
  const std::int64_t most = gzdirect(file.get()) != 0 ? file_bytes : file_bytes * deflate_max_ratio;
  if (count > most) {
    fail(path,
         "its header declares " + std::to_string(count) + " bytes of data, more than a file of " +
             std::to_string(file_bytes) + " bytes can hold" + (gzdirect(file.get()) != 0 ? "" : " even compressed"),
         hint);
  }
  at::Tensor tensor = at::empty(shape, at::kByte);
  read_exact(file.get(), tensor.data_ptr<uint8_t>(), static_cast<std::size_t>(count), path, "data", hint);
  unsigned char extra = 0;
  if (gzread(file.get(), &extra, 1) != 0) fail(path, "it holds more bytes than its header declares", hint);
  return tensor;
}

}  // namespace loom::data
