// A rank's read of its parts of a checkpoint (read_local_parts, io.hpp).
// Each source file is mapped and only its structure (zip directory, data.pkl,
// the small records) is touched; its tensors lie over the mapping unread.
// Every split tensor this rank wants is allocated at its part's size, and
// each copy into it is planned as a run of elements from one source record.
// Then each planned record is read through one bounded buffer (pread, never
// a fault on the mapping): where loom wrote the file, only the blocks
// (64 KiB) that hold a planned element, each checked against its CRC32 from
// the file's block table (block_crc.hpp); otherwise the whole record,
// checked against the zip's CRC32. The planned elements are copied out of
// each chunk. A record no part of this rank lies in is never read.
//
// Elements are placed by the one rule the save layout gives (shard_range):
// a range holds flat elements [begin, end) of chunk `part` of `parts` along
// `dim` of the full tensor. Both the source's ranges and this rank's are
// turned into runs of the flattened full tensor, and their overlaps are the
// copies: any world size and any tensor-parallel split to any other.
#include <loom/checkpoint/io.hpp>
#include <loom/errors.hpp>

#include "checkpoint_bytes.hpp"
#include "file_bytes.hpp"
#include "torch_archive.hpp"
#include "../util/outside_files.hpp"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

namespace loom {
namespace fs = std::filesystem;
using detail::fail_checkpoint;

namespace {

// A file the parts come from: its contents with the tensors unread.
using source_file = detail::unread_file;

// Elements of the flattened full tensor a range holds: (index in the full
// tensor, index in the part, count), in increasing order of both.
struct run {
  std::int64_t full = 0, part = 0, count = 0;
};

std::vector<run> runs_of(const shard_range& range) {
  std::vector<run> runs;
  if (range.begin >= range.end) return runs;
  if (range.dim < 0 || range.parts == 1) {
    runs.push_back({range.begin, 0, range.end - range.begin});
    return runs;
  }
  const auto dim = static_cast<std::size_t>(range.dim);
  std::int64_t inner = 1;
  for (std::size_t d = dim + 1; d < range.shape.size(); ++d) inner *= range.shape[d];
  const std::int64_t block = range.shape[dim] / range.parts * inner;  // the chunk's elements per outer index
  const std::int64_t row = range.shape[dim] * inner;
  for (std::int64_t j = range.begin; j < range.end;) {
    const std::int64_t outer = j / block, within = j % block;
    const std::int64_t count = std::min(block - within, range.end - j);
    runs.push_back({outer * row + range.part * block + within, j - range.begin, count});
    j += count;
  }
  return runs;
}

// Calls copy(part index, source index, count) for every overlap of two run
// lists (each sorted by full index, without overlaps of its own).
template <class Copy>
void overlaps(const std::vector<run>& wanted, const std::vector<run>& held, Copy&& copy) {
  std::size_t i = 0, j = 0;
  while (i < wanted.size() && j < held.size()) {
    const std::int64_t lo = std::max(wanted[i].full, held[j].full);
    const std::int64_t wanted_end = wanted[i].full + wanted[i].count, held_end = held[j].full + held[j].count;
    const std::int64_t hi = std::min(wanted_end, held_end);
    if (lo < hi) copy(wanted[i].part + lo - wanted[i].full, held[j].part + lo - held[j].full, hi - lo);
    if (wanted_end < held_end) ++i;
    else ++j;
  }
}

// The copies planned from each unread record, then made by reading each
// planned record once through one buffer.
class record_plan {
 public:
  // count elements of `held` (over an unread record, or in memory) from
  // element `from` of its flat view, to `to`.
  // to == nullptr: the record is read and checked, nothing copied.
  void copy(const source_file& file, const at::Tensor& held, std::int64_t from, std::int64_t count, char* to) {
    if (count <= 0) return;
    const auto item = static_cast<std::uint64_t>(held.element_size());
    const char* first = static_cast<const char*>(held.data_ptr()) + static_cast<std::uint64_t>(from) * item;
    const void* record = held.storage().data();
    auto found = file.unread.find(record);
    if (found == file.unread.end()) {  // in memory, read and checked already
      if (to != nullptr) std::memcpy(to, first, static_cast<std::size_t>(count) * item);
      return;
    }
    const auto offset = static_cast<std::uint64_t>(first - static_cast<const char*>(record));
    planned_[{&file, record}].push_back({offset, static_cast<std::uint64_t>(count) * item, to});
  }

  // The tensor `lazy` (over an unread record of file) with its own storage,
  // filled when the plan runs.
  at::Tensor whole(const source_file& file, const at::Tensor& lazy) {
    auto found = file.unread.find(lazy.storage().data());
    if (found == file.unread.end()) return lazy;
    const at::Tensor bytes = at::empty({static_cast<std::int64_t>(found->second.bytes)}, at::kByte);
    planned_[{&file, found->first}].push_back({0, found->second.bytes, static_cast<char*>(bytes.data_ptr())});
    return at::empty({0}, lazy.options()).set_(bytes.storage(), lazy.storage_offset(), lazy.sizes(), lazy.strides());
  }

  void run() {
    std::vector<char> buffer;  // grown to the longest run read, up to local_read_buffer_bytes
    for (auto& [where, copies] : planned_) {
      const source_file& file = *where.first;
      const detail::unread_record& record = file.unread.at(where.second);
      std::sort(copies.begin(), copies.end(), [](const planned& a, const planned& b) { return a.offset < b.offset; });
      // The blocks the copies touch, in runs of consecutive blocks, each
      // block read once and checked against its CRC32 (loom's table);
      // without a table the record is one block, checked against the zip's.
      const std::uint64_t block = record.block_bytes > 0 ? record.block_bytes : record.bytes;
      const std::uint64_t blocks = record.block_bytes > 0 ? record.block_crcs.size() : 1;
      span_reader reader{file, record, block, buffer, copies};
      std::uint64_t begin = 0, end = 0;  // the run of blocks not read yet
      for (const planned& copy : copies) {
        if (copy.bytes == 0) continue;
        const std::uint64_t first = copy.offset / block, last = (copy.offset + copy.bytes - 1) / block + 1;
        if (copy.offset + copy.bytes > record.bytes || last > blocks) {
          fail_checkpoint(file.path, "plans a read past the end of record '" + record.name + "'");
        }
        if (first > end) {  // a gap: the run so far is read, and a new one starts
          reader.read(begin, end);
          begin = first;
        }
        end = std::max(end, last);
      }
      reader.read(begin, end);
    }
    planned_.clear();
  }

 private:
  struct planned {
    std::uint64_t offset = 0, bytes = 0;  // within the record
    char* to = nullptr;
  };

  // Reads runs of a record's blocks through the buffer (one pread per
  // buffer), checks each block's CRC32, and copies out the planned bytes.
  struct span_reader {
    const source_file& file;
    const detail::unread_record& record;
    std::uint64_t block;
    std::vector<char>& buffer;
    const std::vector<planned>& copies;
    std::size_t next = 0;  // the first copy not wholly done

    void read(std::uint64_t first_block, std::uint64_t end_block) {
      if (first_block >= end_block) return;
      const std::uint64_t to = std::min(record.bytes, end_block * block);
      const std::uint64_t longest = std::min<std::uint64_t>(to - first_block * block, local_read_buffer_bytes);
      if (buffer.size() < longest) buffer.resize(static_cast<std::size_t>(longest));
      std::uint64_t index = first_block;
      std::uint32_t crc = detail::crc32_of(nullptr, 0);
      for (std::uint64_t at = first_block * block; at < to;) {
        const auto chunk = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), to - at));
        detail::read_at(*file.mapped, record.offset + at, buffer.data(), chunk, file.path, &fail_checkpoint);
        const std::uint64_t end = at + chunk;
        for (std::uint64_t position = at; position < end;) {
          const std::uint64_t block_end = std::min(record.bytes, (index + 1) * block);
          const std::uint64_t upto = std::min(block_end, end);
          crc = detail::crc32_update(crc, buffer.data() + (position - at), upto - position);
          position = upto;
          if (position == block_end) {
            check(index, crc);
            crc = detail::crc32_of(nullptr, 0);
            ++index;
          }
        }
        for (std::size_t c = next; c < copies.size() && copies[c].offset < end; ++c) {
          const planned& p = copies[c];
          const std::uint64_t lo = std::max(p.offset, at), hi = std::min(p.offset + p.bytes, end);
          if (lo < hi && p.to != nullptr) std::memcpy(p.to + (lo - p.offset), buffer.data() + (lo - at), hi - lo);
          if (c == next && p.offset + p.bytes <= end) ++next;
        }
        at = end;
      }
    }

    void check(std::uint64_t index, std::uint32_t crc) const {
      const std::uint32_t expected =
          record.block_bytes > 0 ? record.block_crcs[static_cast<std::size_t>(index)] : record.crc;
#ifndef LOOM_FUZZING
      if (crc != expected) {
        const std::uint64_t from = index * block, to = std::min(record.bytes, from + block);
        fail_checkpoint(file.path, "is corrupted (CRC32 mismatch) in record '" + record.name + "' (bytes " +
                                       std::to_string(from) + " to " + std::to_string(to) + ")");
      }
#else
      (void)crc, (void)expected;
#endif
    }
  };
  std::map<std::pair<const source_file*, const void*>, std::vector<planned>> planned_;
};

// The split tensors of a checkpoint (by name: each file's range of it) and
// the parts this rank makes of them.
class part_maker {
 public:
  part_maker(std::vector<source_file>& files, const rank_parts& mine, const local_read& how, record_plan& plan,
             std::string path)
      : files_(files), mine_(mine), how_(how), plan_(plan), path_(std::move(path)) {}

  // Whether value (at `place`, for parameter `name`) is a split tensor: one
  // of mine, or one the checkpoint splits; an optimizer's scalar is not.
  bool is_split(const std::string& name, const c10::IValue& value, detail::split_place place) const {
    const shard_range* range = saved_range(files_.front(), name);
    if (range == nullptr && !mine_.count(name)) return false;
    if (place == detail::split_place::state_dict) return true;
    if (!value.isTensor() || value.toTensor().dim() == 0) return false;
    const std::int64_t held = range != nullptr ? range->end - range->begin : value.toTensor().numel();
    const std::int64_t full = range != nullptr ? c10::multiply_integers(range->shape) : value.toTensor().numel();
    return value.toTensor().numel() == held &&
           (range != nullptr || c10::multiply_integers(mine_.at(name).range.shape) == full);
  }

  // This rank's part of the tensor `what` names: planned from every file's
  // piece of it that overlaps (replicas once).
  at::Tensor make(const detail::split_site& site, const std::string& what, const detail::tensor_finder& find) {
    const std::string& name = site.name;
    struct held {
      const source_file* file;
      shard_range range;
      at::Tensor values;
    };
    std::vector<held> pieces;
    for (const source_file& file : files_) {
      const c10::IValue value = find(file.contents);
      const shard_range* range = saved_range(file, name);
      if (range == nullptr) {
        // Whole in this file: rank 0's copy serves (the others hold the same).
        if (&file != &files_.front()) continue;
        if (!value.isTensor()) fail_checkpoint(path_, what + " is not a tensor");
        const at::Tensor t = value.toTensor();
        pieces.push_back({&file, {0, t.numel(), t.sizes().vec()}, t});
        continue;
      }
      if (!value.isTensor()) fail_checkpoint(file.path, what + " is missing from this rank file");
      const at::Tensor t = value.toTensor();
      if (t.numel() != range->end - range->begin) {
        fail_checkpoint(file.path, "holds " + std::to_string(t.numel()) + " elements of " + what + " for the range [" +
                                       std::to_string(range->begin) + ", " + std::to_string(range->end) + ")");
      }
      const bool replica = std::any_of(pieces.begin(), pieces.end(), [&](const held& p) {
        return p.range.begin == range->begin && p.range.end == range->end && p.range.part == range->part &&
               p.range.dim == range->dim && p.range.parts == range->parts;
      });
      if (!replica) pieces.push_back({&file, *range, t});
    }
    const std::vector<std::int64_t>& full_shape = pieces.front().range.shape;
    for (const held& p : pieces) {
      if (p.range.shape != full_shape || p.values.scalar_type() != pieces.front().values.scalar_type()) {
        fail_checkpoint(path_, "its files disagree on the shape or dtype of " + what);
      }
    }
    // Mine, or (a tensor this rank does not split) the whole of it.
    rank_part wanted{{0, c10::multiply_integers(full_shape), full_shape}, full_shape};
    if (auto found = mine_.find(name); found != mine_.end()) {
      wanted = found->second;
      if (wanted.range.shape != full_shape) {
        fail_checkpoint(path_, "size mismatch for " + what + ": the checkpoint has shape " +
                                   c10::str(at::IntArrayRef(full_shape)) + ", the model has " +
                                   c10::str(at::IntArrayRef(wanted.range.shape)) + "; nothing was changed");
      }
    }
    const at::TensorOptions options = pieces.front().values.options().device(at::kCPU);
    at::Tensor part = destination(site, wanted.shape, options);
    if (part.numel() != wanted.range.end - wanted.range.begin) {
      throw std::logic_error("read_local_parts: the part of '" + name + "' has " + std::to_string(part.numel()) +
                             " elements for a range of " + std::to_string(wanted.range.end - wanted.range.begin));
    }
    const std::vector<run> want = runs_of(wanted.range);
    std::vector<std::pair<std::int64_t, std::int64_t>> covered;  // (first element, count) of the part
    auto* const out = how_.verify_only ? nullptr : static_cast<char*>(part.data_ptr());
    const auto item = static_cast<std::int64_t>(part.element_size());
    for (const held& p : pieces) {
      at::Tensor values = p.values;
      if (!values.is_contiguous()) values = plan_.whole(*p.file, values);  // copied once read (below)
      auto copy_to = [&, values](std::int64_t at_part, std::int64_t at_held, std::int64_t count) {
        covered.emplace_back(at_part, count);
        if (values.is_contiguous()) {
          plan_.copy(*p.file, values, at_held, count, out == nullptr ? nullptr : out + at_part * item);
        } else if (out != nullptr) {
          later_.push_back([part, values, at_part, at_held, count] {
            part.view({-1}).narrow(0, at_part, count).copy_(values.reshape({-1}).narrow(0, at_held, count));
          });
        }
      };
      overlaps(want, runs_of(p.range), copy_to);
    }
    std::sort(covered.begin(), covered.end());
    std::int64_t reached = 0;
    for (const auto& [first, count] : covered) {
      if (first > reached) break;
      reached = std::max(reached, first + count);
    }
    if (reached < part.numel()) {
      fail_checkpoint(path_, "the files do not hold all of this rank's part of " + what + " (elements " +
                                 std::to_string(reached) + " on of its " + std::to_string(part.numel()) +
                                 " are in no file)");
    }
    return part;
  }

  // What waits for the records to be read (non-contiguous pieces).
  void finish() {
    for (auto& step : later_) step();
    later_.clear();
  }

 private:
  // Where a part is read to: nowhere (verify_only: shape and dtype only),
  // the live tensor `into` names when it fits, or a fresh tensor.
  at::Tensor destination(const detail::split_site& site, const std::vector<std::int64_t>& shape,
                         const at::TensorOptions& options) const {
    if (how_.verify_only) return at::empty(shape, options.device(at::kMeta));
    if (how_.into) {
      at::Tensor live = how_.into(site.entry, site.name, site.field);
      if (live.defined() && live.sizes() == at::IntArrayRef(shape) && live.scalar_type() == c10::typeMetaToScalarType(options.dtype()) &&
          live.device().is_cpu() && live.is_contiguous()) {
        return live;
      }
    }
    return at::empty(shape, options);
  }

  static const shard_range* saved_range(const source_file& file, const std::string& name) {
    auto found = file.contents.metadata.shards.find(name);
    return found == file.contents.metadata.shards.end() ? nullptr : &found->second;
  }

  std::vector<source_file>& files_;
  const rank_parts& mine_;
  const local_read& how_;
  record_plan& plan_;
  std::string path_;
  std::vector<std::function<void()>> later_;
};

// Every tensor still over an unread record of file made whole (the state
// that is not split: rank 0's copy).
void read_the_rest(c10::IValue& value, const source_file& file, record_plan& plan) {
  if (value.isTensor()) {
    value = plan.whole(file, value.toTensor());
  } else if (value.isGenericDict()) {
    auto dict = value.toGenericDict();
    for (auto& item : dict) {
      c10::IValue element = item.value();
      read_the_rest(element, file, plan);
      item.setValue(element);
    }
  } else if (value.isList()) {
    auto list = value.toList();
    for (std::size_t i = 0; i < list.size(); ++i) {
      c10::IValue element = list.get(i);
      read_the_rest(element, file, plan);
      list.set(i, element);
    }
  } else if (value.isTuple()) {
    for (auto& element : value.toTupleRef().elements()) {
      if (element.isTensor() || element.isGenericDict() || element.isList() || element.isTuple()) {
        c10::IValue copy = element;
        read_the_rest(copy, file, plan);
        if (!copy.isSameIdentity(element)) {
          fail_checkpoint(file.path, "holds a tensor in a tuple; loom's checkpoints keep tensors in dicts and lists");
        }
      }
    }
  }
}

}  // namespace

detail::unread_file detail::parse_unread(std::shared_ptr<const mapped_file> mapped, const std::string& path) {
  unread_file file{path, std::move(mapped), {}, {}};
  const std::span<const char> bytes(file.mapped->data, file.mapped->size);
  file.contents = parse_checkpoint(bytes, path, file.mapped, &file.unread);
  // Only the structure was touched: its pages go back.
  drop_mapped_pages(bytes.data(), bytes.size());
  return file;
}

checkpoint_contents read_local_parts(const std::string& path, const rank_parts& mine, const local_read& how) {
  // Groups of files that each split the same tensors: a sharded checkpoint's
  // rank files; a full file; DeepSpeed's model-states and optim-states files.
  std::vector<std::vector<source_file>> groups;
  std::map<std::string, std::string> optimizer_types;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (is_deepspeed_checkpoint(path)) {
      detail::deepspeed_unread files = detail::read_deepspeed_unread(path);
      optimizer_types = files.optim.front().contents.metadata.optimizer_types;
      groups.push_back(std::move(files.model));
      groups.push_back(std::move(files.optim));
    } else {
      detail::sharded_unread files = detail::read_sharded_unread(path);
      optimizer_types = files.index.metadata.optimizer_types;
      groups.push_back(std::move(files.ranks));
    }
  } else {
    auto mapped = detail::map_regular_file(path, &fail_checkpoint);
    if (!mapped) fail_checkpoint(path, "does not exist");
    groups.emplace_back();
    groups.back().push_back(detail::parse_unread(std::move(*mapped), path));
  }
  checkpoint_contents out;
  out.metadata = groups.front().front().contents.metadata;
  out.metadata.shards.clear();
  out.metadata.global_rank = 0;
  for (const auto& [entry, type] : optimizer_types) out.metadata.optimizer_types[entry] = type;
  record_plan plan;
  std::vector<std::unique_ptr<part_maker>> makers;
  for (auto& group : groups) {
    auto& parts = *makers.emplace_back(std::make_unique<part_maker>(group, mine, how, plan, path));
    c10::impl::GenericDict entries = detail::rebuild_split_tensors(
        group.front().contents.entries,
        [&](const std::string& name, const c10::IValue& value, detail::split_place place) {
          return parts.is_split(name, value, place);
        },
        [&](const detail::split_site& site, const std::string& what, const detail::tensor_finder& find) -> c10::IValue {
          return parts.make(site, what, find);
        });
    c10::IValue rest(entries);
    read_the_rest(rest, group.front(), plan);
    for (const auto& item : entries) out.entries.insert_or_assign(item.key(), item.value());
  }
  plan.run();
  if (!how.verify_only) {
    for (auto& parts : makers) parts->finish();
  }
  return out;
}

}  // namespace loom
