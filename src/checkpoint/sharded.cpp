// Sharded checkpoints (Lightning's state_dict_type="sharded"): a directory
// with one file per rank, each a checkpoint in loom's format holding that
// rank's slices of the sharded parameters and optimizer state (keyed by
// parameter name, with each slice's range in the flattened parameter), and
// meta.pt, written last by rank 0, with every rank file's size and CRC32.
//
// Saving stages the directory beside PATH and publishes it in one step
// (publish_directory), so PATH is always the complete old or the complete
// new checkpoint. Reading checks meta.pt and every file before anything is
// parsed, then concatenates each parameter's slices in range order: a
// checkpoint written on any number of ranks reads as full tensors, which is
// how it reshards and how consolidate makes one file of it.
#include <loom/checkpoint/io.hpp>
#include <loom/errors.hpp>

#include "checkpoint_bytes.hpp"
#include "file_bytes.hpp"
#include "manifest.hpp"
#include "torch_archive.hpp"
#include "../util/outside_files.hpp"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <filesystem>
#include <map>

namespace loom {
namespace fs = std::filesystem;
using detail::fail_checkpoint;

namespace {

constexpr const char* meta_file = "meta.pt";
using detail::files_key;

std::string rank_file(std::int64_t rank, std::int64_t world) {
  return "shard_" + std::to_string(rank) + "_of_" + std::to_string(world) + ".pt";
}

struct piece {
  std::int64_t begin = 0, end = 0;
  at::Tensor values;
  std::int64_t part = 0;  // the tensor-parallel chunk it is in
};

// One tensor from the slices the ranks hold, in range order, written into
// `out` (contiguous, range.shape); replicas (the same range on several
// ranks: NO_SHARD, HYBRID_SHARD's replicate groups) count once.
void concatenate_into(std::vector<piece> pieces, const shard_range& range, const at::Tensor& out,
                      const std::string& what, const std::string& path) {
  std::sort(pieces.begin(), pieces.end(), [](const piece& a, const piece& b) { return a.begin < b.begin; });
  const std::int64_t numel = c10::multiply_integers(range.shape);
  const at::Tensor flat = out.view({-1});
  std::int64_t covered = 0;
  for (const auto& p : pieces) {
    // A replica, or empty (a parameter wholly in another rank's part of its
    // unit: its range then starts wherever this rank's part does).
    if (p.end <= covered || p.begin == p.end) continue;
    if (p.begin != covered) {
      fail_checkpoint(path, "the shards of " + what + " do not tile it: elements " + std::to_string(covered) +
                                " to " + std::to_string(p.begin) + " are in no rank's file");
    }
    if (p.values.numel() != p.end - p.begin || p.end > numel) {
      fail_checkpoint(path, "a shard of " + what + " holds " + std::to_string(p.values.numel()) +
                                " elements for the range [" + std::to_string(p.begin) + ", " + std::to_string(p.end) +
                                ")");
    }
    flat.narrow(0, p.begin, p.end - p.begin).copy_(p.values.reshape({-1}));
    covered = p.end;
  }
  if (covered != numel) {
    fail_checkpoint(path, "the shards of " + what + " cover " + std::to_string(covered) + " of its " +
                              std::to_string(numel) + " elements");
  }
}

// One tensor from the ranks' pieces: each tensor-parallel chunk
// concatenated from its pieces into its place in the full tensor (through
// one chunk-sized buffer where that place is not contiguous: chunks along
// a dimension other than the first), so assembling holds the full tensor
// and at most one chunk.
at::Tensor assemble(std::vector<piece> pieces, const shard_range& range, const std::string& what,
                    const std::string& path) {
  if (pieces.empty()) fail_checkpoint(path, "no rank's file holds " + what);
  at::Tensor out = at::empty(range.shape, pieces.front().values.options());
  if (range.dim < 0) {
    concatenate_into(std::move(pieces), range, out, what, path);
    return out;
  }
  shard_range chunk = range;
  chunk.shape[static_cast<std::size_t>(range.dim)] /= range.parts;
  const std::vector<at::Tensor> places = out.chunk(range.parts, range.dim);
  at::Tensor staging;
  for (std::int64_t part = 0; part < range.parts; ++part) {
    std::vector<piece> mine;
    for (auto& p : pieces) {
      if (p.part == part) mine.push_back(p);
    }
    if (mine.empty()) {
      fail_checkpoint(path, "no rank's file holds tensor-parallel chunk " + std::to_string(part) + " of " +
                                std::to_string(range.parts) + " of " + what);
    }
    const at::Tensor& place = places[static_cast<std::size_t>(part)];
    const std::string which = what + " (chunk " + std::to_string(part) + ")";
    if (place.is_contiguous()) {
      concatenate_into(std::move(mine), chunk, place, which, path);
      continue;
    }
    if (!staging.defined()) staging = at::empty(chunk.shape, out.options());
    concatenate_into(std::move(mine), chunk, staging, which, path);
    place.copy_(staging);
  }
  return out;
}

bool is_optimizer_dict(const c10::IValue& value) {
  if (!value.isGenericDict()) return false;
  const auto dict = value.toGenericDict();
  return dict.contains("state") && dict.contains("param_groups");
}

}  // namespace

c10::impl::GenericDict detail::rebuild_split_tensors(const c10::impl::GenericDict& entries, const split_test& is_split,
                                                     const split_maker& make) {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  auto entry_of = [](const checkpoint_contents& rank, const std::string& entry) {
    auto found = rank.entries.find(entry);
    return found == rank.entries.end() ? c10::IValue() : found->value();
  };
  for (const auto& item : entries) {
    const std::string entry = item.key().toStringRef();
    const c10::IValue& value = item.value();
    if (entry == files_key) continue;
    if (is_optimizer_dict(value)) {
      // torch.optim's layout, keyed by parameter name: each per-parameter
      // state tensor of a split parameter made anew; scalars (step) kept.
      auto dict = value.toGenericDict().copy();
      auto state = dict.at("state").toGenericDict().copy();
      for (const auto& per : value.toGenericDict().at("state").toGenericDict()) {
        if (!per.key().isString() || !per.value().isGenericDict()) continue;
        const std::string name = per.key().toStringRef();
        auto fields = per.value().toGenericDict().copy();
        for (const auto& field : per.value().toGenericDict()) {
          if (!field.key().isString()) continue;  // a forged file's (found by fuzzing)
          const std::string key = field.key().toStringRef();
          if (!is_split(name, field.value(), split_place::optimizer_state)) continue;
          fields.insert_or_assign(key, make({entry, name, key, split_place::optimizer_state},
                                            "'" + entry + "' state '" + key + "' of '" + name + "'",
                                            [&](const checkpoint_contents& rank) -> c10::IValue {
                                              const c10::IValue o = entry_of(rank, entry);
                                              if (!is_optimizer_dict(o)) return {};
                                              const auto s = o.toGenericDict().at("state").toGenericDict();
                                              auto f = s.find(name);
                                              if (f == s.end() || !f->value().isGenericDict()) return {};
                                              auto g = f->value().toGenericDict().find(key);
                                              return g == f->value().toGenericDict().end() ? c10::IValue() : g->value();
                                            }));
        }
        state.insert_or_assign(per.key(), fields);
      }
      dict.insert_or_assign("state", state);
      out.insert(entry, dict);
    } else if (value.isGenericDict()) {
      // A module's state dict (or a dict keyed by parameter name).
      auto dict = value.toGenericDict().copy();
      for (const auto& field : value.toGenericDict()) {
        if (!field.key().isString()) continue;
        const std::string name = field.key().toStringRef();
        if (!is_split(name, field.value(), split_place::state_dict)) continue;
        dict.insert_or_assign(field.key(), make({entry, name, "", split_place::state_dict}, "'" + entry + "." + name + "'",
                                                [&](const checkpoint_contents& rank) -> c10::IValue {
                                                  const c10::IValue m = entry_of(rank, entry);
                                                  if (!m.isGenericDict()) return {};
                                                  auto f = m.toGenericDict().find(name);
                                                  return f == m.toGenericDict().end() ? c10::IValue() : f->value();
                                                }));
      }
      out.insert(entry, dict);
    } else {
      out.insert(entry, value);
    }
  }
  return out;
}

// The full contents from every rank's: sharded tensors concatenated, the
// rest taken from rank 0's file.
checkpoint_contents detail::merge_shards(std::vector<checkpoint_contents>& ranks, const std::string& path,
                                         deferred_tensors* deferred) {
  checkpoint_contents out;
  out.metadata = ranks.front().metadata;
  out.metadata.shards.clear();
  out.metadata.global_rank = 0;
  const shard_layout& layout = ranks.front().metadata.shards;
  const split_test is_split = [&](const std::string& name, const c10::IValue& value, split_place place) {
    auto range = layout.find(name);
    if (range == layout.end()) return false;
    if (place == split_place::state_dict) return true;
    // The parameter's slice, flat (sharded engines) or shaped (a
    // tensor-parallel chunk kept whole); scalars (step) are kept.
    return value.isTensor() && value.toTensor().dim() > 0 &&
           value.toTensor().numel() == range->second.end - range->second.begin;
  };
  const split_maker merged = [&](const split_site& site, const std::string& what,
                                 const tensor_finder& find) -> c10::IValue {
    const std::string& name = site.name;
    std::vector<piece> pieces;
    for (const auto& rank : ranks) {
      auto found = rank.metadata.shards.find(name);
      if (found == rank.metadata.shards.end()) {
        fail_checkpoint(path, "rank " + std::to_string(rank.metadata.global_rank) + "'s file has no range for '" +
                                  name + "'");
      }
      const c10::IValue value = find(rank);
      if (!value.isTensor()) fail_checkpoint(path, what + " is missing from rank " + std::to_string(rank.metadata.global_rank) + "'s file");
      const shard_range& expected = layout.at(name);
      if (found->second.dim != expected.dim || found->second.parts != expected.parts ||
          found->second.shape != expected.shape) {
        fail_checkpoint(path, "rank " + std::to_string(rank.metadata.global_rank) + "'s file splits '" + name +
                                  "' differently from rank 0's");
      }
      pieces.push_back({found->second.begin, found->second.end, value.toTensor(), found->second.part});
    }
    const shard_range& range = layout.at(name);
    if (deferred != nullptr) {
      const at::ScalarType dtype = pieces.front().values.scalar_type();
      return deferred->stand_in(range.shape, dtype, [pieces = std::move(pieces), range, what, path]() {
        at::Tensor whole = assemble(pieces, range, what, path);
        // Read once: the pieces' pages of the mapped rank files go back.
        for (const auto& p : pieces) {
          if (detail::lies_over_backing(p.values)) {
            detail::drop_mapped_pages(p.values.data_ptr(), static_cast<std::size_t>(p.values.nbytes()));
          }
        }
        return whole;
      });
    }
    return assemble(std::move(pieces), range, what, path);
  };
  out.entries = rebuild_split_tensors(ranks.front().entries, is_split, merged);
  return out;
}

bool is_sharded_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / meta_file, ec);
}

void save_sharded_checkpoint(const std::string& path, const state& state, const checkpoint_metadata& metadata,
                             const shard_layout& layout, comm::process_group& group) {
  const int rank = group.rank();
  const int world = group.size();
  // Rank 0 decides where to stage, and whether PATH may be replaced; every
  // rank learns the answer (an error included) before anything is written.
  std::string answer;
  if (rank == 0) {
    std::error_code ec;
    const fs::path target = fs::absolute(path);
    if (fs::exists(target, ec) && fs::is_directory(target, ec) && !is_sharded_checkpoint(path)) {
      answer = "!is an existing directory that is not a loom sharded checkpoint (it has no meta.pt); loom replaces "
               "only its own checkpoints: choose another path or remove it";
    } else {
      answer = detail::fresh_staging_directory(target.parent_path().string(), target.filename().string() + ".tmp-");
    }
  }
  const fs::path staged = detail::agree_on_staging(path, answer, group);

  checkpoint_metadata mine = metadata;
  mine.global_rank = rank;
  mine.world_size = world;
  mine.shards = layout;
  const detail::listed_file written =
      detail::write_listed(staged, rank_file(rank, world), detail::checkpoint_entries(path, state, {}, mine));
  const auto files = detail::gather_listed(group, {written}, [&](int r, std::size_t) { return rank_file(r, world); });
  if (rank == 0) {
    c10::impl::GenericDict entries(c10::StringType::get(), c10::AnyType::get());
    checkpoint_metadata shared = metadata;
    shared.world_size = world;
    for (const auto& entry : state.entries()) {
      if (std::string type = entry.io().type_name(); !type.empty()) shared.optimizer_types[entry.name()] = type;
    }
    entries.insert(detail::metadata_key, detail::metadata_value(shared));
    entries.insert(files_key, detail::listed_value(files));
    // The non-module state (Lightning's meta.pt role): what is neither a
    // module nor an optimizer (the rank files hold it too; loads read rank 0's).
    const detail::parameter_names no_names;
    for (const auto& entry : state.entries()) {
      if (entry.io().module() == nullptr && entry.io().optimizer() == nullptr) {
        entries.insert(entry.name(), entry.io().save(nullptr, no_names));
      }
    }
    detail::write_entries((staged / meta_file).string(), entries);
    publish_directory(staged.string(), path);
  }
  if (group.valid()) group.barrier();
}

checkpoint_contents read_sharded_checkpoint(const std::string& directory) {
  return detail::read_sharded(directory, nullptr);
}

namespace {

// The directory's meta.pt, parsed: the index of a sharded checkpoint.
checkpoint_contents read_index(const detail::confined_directory& root, const std::string& directory) {
  const auto meta_bytes = root.read(meta_file);
  if (!meta_bytes) {
    fail_checkpoint(directory, "is a directory without meta.pt (a loom sharded checkpoint) or latest (a ZeRO "
                               "checkpoint in DeepSpeed's layout): neither, or a save that did not finish");
  }
  return detail::parse_checkpoint(*meta_bytes, root.path_of(meta_file));
}

}  // namespace

detail::sharded_unread detail::read_sharded_unread(const std::string& directory) {
  const confined_directory root(directory, &fail_checkpoint);
  const fs::path meta_path = root.path_of(meta_file);
  sharded_unread out{read_index(root, directory), {}};
  for (const listed_file& listed : listed_files(out.index, meta_path)) {
    file_bytes opened = open_listed(root, listed, out.index, meta_path, /*map_file=*/true);
    out.ranks.push_back(parse_unread(std::move(opened.mapped), root.path_of(listed.name)));
    check_same_save(out.ranks.back().contents, out.index, out.ranks.back().path, meta_path);
  }
  if (out.ranks.empty()) fail_checkpoint(meta_path.string(), "lists no rank files");
  std::stable_sort(out.ranks.begin(), out.ranks.end(), [](const unread_file& a, const unread_file& b) {
    return a.contents.metadata.global_rank < b.contents.metadata.global_rank;
  });
  return out;
}

checkpoint_contents detail::read_sharded(const std::string& directory, deferred_tensors* deferred) {
  const detail::confined_directory root(directory, &fail_checkpoint);
  const fs::path meta_path = root.path_of(meta_file);
  const checkpoint_contents meta = read_index(root, directory);
  std::vector<checkpoint_contents> ranks;
  for (auto& [name, contents] : detail::read_listed(root, meta, meta_path, /*map_files=*/deferred != nullptr)) {
    ranks.push_back(std::move(contents));
  }
  if (ranks.empty()) fail_checkpoint(meta_path.string(), "lists no rank files");
  checkpoint_contents merged = detail::merge_shards(ranks, directory, deferred);
  merged.metadata.optimizer_types = meta.metadata.optimizer_types;
  return merged;
}

}  // namespace loom
