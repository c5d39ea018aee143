// A checkpoint file's bytes: what save_checkpoint writes and read_checkpoint
// parses, apart from where they go, so that sharded saves (one file per
// rank, sharded.cpp) and consolidation share them. Internal to src/checkpoint.
#pragma once

#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/state.hpp>

#include "torch_archive.hpp"
#include "../util/outside_files.hpp"

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom::detail {

// The entry holding loom's metadata in every checkpoint file.
inline constexpr const char* metadata_key = "__loom__";

std::vector<char> read_file(const std::string& path);
c10::IValue metadata_value(const checkpoint_metadata& metadata);
// The entries of a checkpoint file for state (with filter), as
// save_checkpoint writes them (write_torch_archive); path names the
// checkpoint in errors. The tensors are the state's own, not copies.
c10::impl::GenericDict checkpoint_entries(const std::string& path, const state& state, const state_filter& filter,
                                          const checkpoint_metadata& metadata);
// The same, naming optimizer state by the parameter names of names_from's
// modules (a file holding optimizers without their modules).
c10::impl::GenericDict checkpoint_entries(const std::string& path, const state& state, const state_filter& filter,
                                          const checkpoint_metadata& metadata, const loom::state& names_from);

// Tensors made whole only while their record is written (consolidate: one
// full tensor at a time). A stand-in has the dtype, shape and storage size
// of the tensor it stands for and no memory: what the pickle says of it is
// what it says of the whole tensor, so the archive is byte for byte the one
// the whole tensors would give.
class deferred_tensors {
 public:
  at::Tensor stand_in(const std::vector<std::int64_t>& shape, at::ScalarType dtype, std::function<at::Tensor()> make);
  // The tensor whose bytes the record of `stored` holds: made now if it is
  // a stand-in, else itself.
  at::Tensor materialize(const at::Tensor& stored) const;

 private:
  std::unordered_map<const void*, std::function<at::Tensor()>> makers_;  // by StorageImpl
};

// Bytes as they are produced (each call appends), and what produces one
// file's bytes into a sink, once.
using byte_sink = std::function<void(const char* data, std::size_t size)>;
using file_producer = std::function<void(const byte_sink&)>;
struct written_file {
  std::int64_t bytes = 0;
  std::uint32_t crc32 = 0;
};
// write_file_atomically's streaming form: the producer's bytes go to the
// temporary file as they come (no buffer of the file's size), then fsync and
// rename as for a buffer. A failed write, or the producer's exception,
// removes the temporary file and leaves path as it was. Returns the file's
// size and CRC32, taken while writing.
written_file write_file_atomically(const std::string& path, const file_producer& produce);
// A checkpoint file's entries (metadata included) written atomically to
// path as the archive is serialised: no buffer of the file's size.
written_file write_entries(const std::string& path, const c10::impl::GenericDict& entries,
                           const deferred_tensors* deferred = nullptr);
// contents (metadata, then entries) written so: write_checkpoint, and
// consolidate with its deferred tensors.
written_file write_contents(const std::string& path, const checkpoint_contents& contents,
                            const deferred_tensors* deferred = nullptr);
// Bytes read from path, verified and parsed.
checkpoint_contents parse_checkpoint(const std::vector<char>& bytes, const std::string& path);
// With a backing, the tensors lie over bytes (read_torch_archive); with
// unread too, they are left unread and listed there
// (read_torch_archive_structure; a file in loom's earlier format is read
// whole and lists nothing).
checkpoint_contents parse_checkpoint(std::span<const char> bytes, const std::string& path,
                                     std::shared_ptr<const void> backing, unread_records* unread = nullptr);

// Where a split tensor sits in a checkpoint's entries: a state dict (a
// module's, or any dict keyed by parameter name, as ZeRO's fp32 masters),
// or a per-parameter state field of an optimizer in torch.optim's layout.
enum class split_place { state_dict, optimizer_state };
using split_test = std::function<bool(const std::string& name, const c10::IValue& value, split_place place)>;
// The value at the same place in another file's contents (None if absent).
using tensor_finder = std::function<c10::IValue(const checkpoint_contents& file)>;
// Where one split tensor is: its entry, its parameter's name, and the
// optimizer state field ("" in a state dict).
struct split_site {
  std::string entry, name, field;
  split_place place = split_place::state_dict;
};
// The value that replaces a split tensor; `what` names it in errors.
using split_maker =
    std::function<c10::IValue(const split_site& site, const std::string& what, const tensor_finder& find)>;
// entries (rank 0's file's) with every value is_split picks replaced by
// make's: the one walk of a sharded checkpoint's layout, shared by the
// merge to full size and a rank's read of its parts. The files index is
// left out; every other entry is kept as it is.
c10::impl::GenericDict rebuild_split_tensors(const c10::impl::GenericDict& entries, const split_test& is_split,
                                             const split_maker& make);

// Every rank's contents into one: tensors with a range in the first rank's
// metadata.shards concatenated in range order, the rest taken from it. With
// deferred, the concatenated tensors are its stand-ins, made when written.
checkpoint_contents merge_shards(std::vector<checkpoint_contents>& ranks, const std::string& path,
                                 deferred_tensors* deferred = nullptr);
// A file parsed without reading its tensors (read_torch_archive_structure;
// local_parts.cpp): its contents, whose tensors lie over `mapped` unread,
// and those records. A file in loom's earlier format is read whole and
// lists nothing unread.
struct unread_file {
  std::string path;
  std::shared_ptr<const mapped_file> mapped;
  unread_records unread;
  checkpoint_contents contents;
};
unread_file parse_unread(std::shared_ptr<const mapped_file> mapped, const std::string& path);
// A sharded checkpoint's rank files so parsed, each listed one checked
// against the size meta.pt (its index) gives it, rank 0's first.
struct sharded_unread {
  checkpoint_contents index;
  std::vector<unread_file> ranks;
};
sharded_unread read_sharded_unread(const std::string& directory);
// A DeepSpeed-layout checkpoint's files so parsed, each listed one checked
// against the size rank 0's model states give it: the module's (rank 0's
// model states first; stages 0-2 have only it) and the optimizers' (by rank).
struct deepspeed_unread {
  std::vector<unread_file> model, optim;
};
deepspeed_unread read_deepspeed_unread(const std::string& path);

// read_sharded_checkpoint and read_deepspeed_checkpoint, with the rank files
// mapped and the merged tensors deferred (consolidate_checkpoint).
checkpoint_contents read_sharded(const std::string& directory, deferred_tensors* deferred);
checkpoint_contents read_deepspeed(const std::string& path, deferred_tensors* deferred);

}  // namespace loom::detail
