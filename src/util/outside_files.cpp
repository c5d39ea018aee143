#include "outside_files.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace loom::detail {

namespace {

[[noreturn]] void refused(refuse_file refuse, const std::string& path, const std::string& why) {
  refuse(path, why);
  std::abort();  // a refuse_file throws; never reached
}

std::string errno_text(int error) { return std::strerror(error); }

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes the descriptor on every way out.
struct descriptor_guard {
  int fd;
  ~descriptor_guard() {
    if (fd >= 0) ::close(fd);
  }
};

// The size of an opened file, refused unless it is a regular file.
std::size_t regular_size(int fd, const std::string& path, refuse_file refuse) {
  struct stat status {};
  if (::fstat(fd, &status) != 0) refused(refuse, path, "cannot be examined (" + errno_text(errno) + ")");
  if (!S_ISREG(status.st_mode)) {
    refused(refuse, path, std::string("is ") + kind_of(status.st_mode) + ", not a regular file: only regular files are read");
  }
  return static_cast<std::size_t>(status.st_size);
}

// The bytes of an opened file: a regular file of at most limit bytes, read
// to the size fstat gave (a file that shrinks meanwhile is refused).
std::vector<char> read_opened(int fd, const std::string& path, std::size_t limit, refuse_file refuse) {
  const std::size_t size = regular_size(fd, path, refuse);
  if (size > limit) {
    refused(refuse, path, "has " + std::to_string(size) + " bytes, more than the " + std::to_string(limit) +
                              " this reader accepts");
  }
  std::vector<char> bytes(size);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, bytes.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refused(refuse, path, "read error (" + errno_text(errno) + ")");
    if (n == 0) refused(refuse, path, "became shorter while it was read (" + std::to_string(done) + " of " +
                                          std::to_string(size) + " bytes)");
    done += static_cast<std::size_t>(n);
  }
  return bytes;
}

}  // namespace

std::optional<regular_file> open_regular_file(const std::string& path, refuse_file refuse) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once, and fstat refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    refused(refuse, path, "cannot be opened (" + errno_text(errno) + ")");
  }
  descriptor_guard guard{fd};
  const std::size_t bytes = regular_size(fd, path, refuse);
  // Reads block as usual from here on (O_NONBLOCK means nothing to a regular file's reads).
  guard.fd = -1;
  return regular_file{fd, bytes};
}

std::optional<std::vector<char>> read_regular_file(const std::string& path, std::size_t limit, refuse_file refuse) {
  const auto file = open_regular_file(path, refuse);
  if (!file) return std::nullopt;
  descriptor_guard guard{file->descriptor};
  return read_opened(file->descriptor, path, limit, refuse);
}

confined_directory::confined_directory(std::string path, int descriptor, refuse_file refuse) noexcept
    : path_(std::move(path)), descriptor_(descriptor), refuse_(refuse) {}

confined_directory::confined_directory(const std::string& path, refuse_file refuse) : path_(path), refuse_(refuse) {
  descriptor_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (descriptor_ < 0) {
    refused(refuse, path, errno == ENOTDIR ? std::string("is not a directory")
                                           : "cannot be opened as a directory (" + errno_text(errno) + ")");
  }
}

confined_directory::confined_directory(confined_directory&& other) noexcept
    : path_(std::move(other.path_)), descriptor_(std::exchange(other.descriptor_, -1)), refuse_(other.refuse_) {}

confined_directory::~confined_directory() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

std::string confined_directory::path_of(const std::string& name) const {
  return path_.empty() || path_.back() == '/' ? path_ + name : path_ + "/" + name;
}

void confined_directory::check_name(const std::string& name) const {
  const bool one_component = !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
                             name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
  if (!one_component) {
    refused(refuse_, path_, "is asked for '" + name + "', which is not the name of an entry in it (names an index "
                            "gives are single file names: no '/', '..' or absolute path)");
  }
}

confined_directory confined_directory::subdirectory(const std::string& name) const {
  check_name(name);
  const int fd = ::openat(descriptor_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    // O_DIRECTORY | O_NOFOLLOW on a link fails with ENOTDIR (ELOOP on some
    // systems); what the entry is only shapes the message.
    struct stat status {};
    const bool link = ::fstatat(descriptor_, name.c_str(), &status, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(status.st_mode);
    if (error == ELOOP || (error == ENOTDIR && link)) {
      refused(refuse_, path_of(name), "is a symbolic link, not a directory inside " + path_);
    }
    if (error == ENOTDIR || error == ENOENT) refused(refuse_, path_of(name), "is not a directory inside " + path_);
    refused(refuse_, path_of(name), "cannot be opened as a directory (" + errno_text(error) + ")");
  }
  return confined_directory(path_of(name), fd, refuse_);
}

int confined_directory::open_entry(const std::string& name) const {
  check_name(name);
  const int fd = ::openat(descriptor_, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return -1;
    if (error == ELOOP) {
      refused(refuse_, path_of(name), "is a symbolic link: the files of a checkpoint directory are read only as "
                                      "regular files in it (links are refused, even to files inside it)");
    }
    refused(refuse_, path_of(name), "cannot be opened (" + errno_text(error) + ")");
  }
  return fd;
}

std::optional<std::vector<char>> confined_directory::read(const std::string& name, std::size_t limit) const {
  const int fd = open_entry(name);
  if (fd < 0) return std::nullopt;
  descriptor_guard guard{fd};
  return read_opened(fd, path_of(name), limit, refuse_);
}

void drop_mapped_pages(const void* data, std::size_t bytes) noexcept {
  if (bytes == 0) return;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<std::uintptr_t>(data) / page * page;
  const auto end = reinterpret_cast<std::uintptr_t>(data) + bytes;
  ::madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED);
}

mapped_file::~mapped_file() {
  if (size > 0) ::munmap(const_cast<char*>(data), size);
  if (descriptor >= 0) ::close(descriptor);
}

void read_at(const mapped_file& file, std::uint64_t offset, char* out, std::size_t bytes, const std::string& path,
             refuse_file refuse) {
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(file.descriptor, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refused(refuse, path, "read error (" + errno_text(errno) + ")");
    if (n == 0) {
      refused(refuse, path, "became shorter while it was read (" + std::to_string(bytes - done) + " bytes missing at " +
                                std::to_string(offset + done) + ")");
    }
    done += static_cast<std::size_t>(n);
  }
}

namespace {

// Maps an opened regular file, which the mapping then owns.
std::shared_ptr<const mapped_file> map_opened(int fd, const std::string& path, refuse_file refuse) {
  descriptor_guard guard{fd};
  const std::size_t size = regular_size(fd, path, refuse);
  void* data = nullptr;
  if (size > 0) {
    data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) refused(refuse, path, "cannot be mapped (" + errno_text(errno) + ")");
  }
  guard.fd = -1;
  return std::make_shared<const mapped_file>(static_cast<const char*>(data), size, fd);
}

}  // namespace

std::optional<std::shared_ptr<const mapped_file>> map_regular_file(const std::string& path, refuse_file refuse) {
  const auto file = open_regular_file(path, refuse);
  if (!file) return std::nullopt;
  return map_opened(file->descriptor, path, refuse);
}

std::optional<std::shared_ptr<const mapped_file>> confined_directory::map(const std::string& name) const {
  const int fd = open_entry(name);
  if (fd < 0) return std::nullopt;
  return map_opened(fd, path_of(name), refuse_);
}

std::optional<file_bytes> confined_directory::load(const std::string& name, bool map_file) const {
  if (map_file) {
    auto mapped = map(name);
    if (!mapped) return std::nullopt;
    return file_bytes{{}, std::move(*mapped)};
  }
  auto bytes = read(name);
  if (!bytes) return std::nullopt;
  return file_bytes{std::move(*bytes), nullptr};
}

bool confined_directory::has(const std::string& name) const {
  check_name(name);
  struct stat status {};
  return ::fstatat(descriptor_, name.c_str(), &status, AT_SYMLINK_NOFOLLOW) == 0;
}

}  // namespace loom::detail
