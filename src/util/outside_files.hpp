// Reading files loom did not write (checkpoints, the files their indexes
// list, DeepSpeed configs). Every check is made on the opened descriptor,
// never by a stat before the open, so what is checked is what is read:
// - only regular files are read (a FIFO would block the reader forever,
//   /dev/zero would never end), and at most a stated number of bytes;
// - a name that an index inside a directory gives is one path component,
//   opened relative to that directory's descriptor without following a
//   symbolic link: no '/', '..' or absolute path, and no link, even to a
//   file inside the directory, can take a read outside it.
// Paths the user names are theirs: links in them are followed.
// Internal to src/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace loom::detail {

// How a reader reports a refused file: throws its own error type (a
// checkpoint_error, a configuration_error) naming the path; never returns.
using refuse_file = void (*)(const std::string& path, const std::string& why);

inline constexpr std::size_t no_size_limit = std::numeric_limits<std::size_t>::max();

// The file the user named, opened, if it is a regular file: its descriptor
// (the caller owns it) and its size; nullopt when nothing is there.
struct regular_file {
  int descriptor = -1;
  std::size_t bytes = 0;
};
std::optional<regular_file> open_regular_file(const std::string& path, refuse_file refuse);

// The bytes of the file the user named, if it is a regular file of at most
// `limit` bytes; nullopt when nothing is there.
std::optional<std::vector<char>> read_regular_file(const std::string& path, std::size_t limit, refuse_file refuse);

// A regular file mapped into memory, private and copy-on-write (a tensor
// over its pages may be written without changing the file), unmapped when
// the last holder lets go. Its pages are the page cache's, read when first
// touched and given back under memory pressure: none is on the heap. A file
// truncated by someone else while it is mapped ends the process with
// SIGBUS, so only readers that ask for it map (loom-consolidate, and a
// rank's reads of its parts, which touch only the file's structure through
// the mapping and read its tensors' bytes with read_at). The file stays
// open meanwhile.
struct mapped_file {
  mapped_file(const char* data, std::size_t size, int descriptor) noexcept
      : data(data), size(size), descriptor(descriptor) {}
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file();
  const char* data;
  std::size_t size;
  int descriptor;
};
// The file's bytes [offset, offset + bytes) into out (pread: a file that
// became shorter is refused, never a signal).
void read_at(const mapped_file& file, std::uint64_t offset, char* out, std::size_t bytes, const std::string& path,
             refuse_file refuse);
// The file the user named, mapped; nullopt when nothing is there.
std::optional<std::shared_ptr<const mapped_file>> map_regular_file(const std::string& path, refuse_file refuse);
// Gives the pages under [data, data + bytes) of a mapped_file back
// (madvise MADV_DONTNEED): the resident set shrinks, and a later read
// faults them in again from the page cache. Only for pages never written
// (a written copy-on-write page would lose what was written).
void drop_mapped_pages(const void* data, std::size_t bytes) noexcept;

// A file's bytes, read onto the heap or mapped (confined_directory::load).
struct file_bytes {
  std::vector<char> read;
  std::shared_ptr<const mapped_file> mapped;
  std::span<const char> bytes() const {
    return mapped ? std::span<const char>(mapped->data, mapped->size) : std::span<const char>(read);
  }
};

// A directory whose entries are named by data inside it, opened once.
class confined_directory {
 public:
  // The user's path (links followed); refused unless it is a directory.
  confined_directory(const std::string& path, refuse_file refuse);
  confined_directory(confined_directory&& other) noexcept;
  confined_directory& operator=(confined_directory&&) = delete;
  confined_directory(const confined_directory&) = delete;
  ~confined_directory();

  // The directory `name` inside this one (not a link to one).
  confined_directory subdirectory(const std::string& name) const;
  // The regular file `name` inside it, at most `limit` bytes; nullopt when
  // it has no entry of that name.
  std::optional<std::vector<char>> read(const std::string& name, std::size_t limit = no_size_limit) const;
  // The same file mapped instead of read (mapped_file).
  std::optional<std::shared_ptr<const mapped_file>> map(const std::string& name) const;
  // read(name) or, with map_file, map(name).
  std::optional<file_bytes> load(const std::string& name, bool map_file) const;
  // Whether it has an entry of that name, of any kind (what to read next is
  // chosen by it; the read itself checks the entry).
  bool has(const std::string& name) const;

  const std::string& path() const noexcept { return path_; }
  std::string path_of(const std::string& name) const;

 private:
  confined_directory(std::string path, int descriptor, refuse_file refuse) noexcept;
  void check_name(const std::string& name) const;
  // The regular file `name`, opened without following a link; -1 when there is none.
  int open_entry(const std::string& name) const;

  std::string path_;
  int descriptor_ = -1;
  refuse_file refuse_;
};

}  // namespace loom::detail
