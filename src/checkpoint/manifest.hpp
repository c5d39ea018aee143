// The manifest of a checkpoint of several files (the sharded layout's
// meta.pt, the DeepSpeed layout's rank-0 model states): the save is staged
// in a fresh directory that rank 0 chooses, every rank writes its files
// there and reports their sizes and CRC32s, and rank 0 writes the index
// that lists them last, so an index names only files that are complete. A
// reader checks every listed file (present, size, CRC32) before it parses
// any, so a torn or mixed save is refused with nothing changed. Both
// layouts use this one protocol; they differ only in file names and in
// where the staged directory is published. Internal to src/checkpoint.
#pragma once

#include <loom/checkpoint/io.hpp>
#include <loom/comm/process_group.hpp>

#include "../util/outside_files.hpp"

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

// The entry of an index that lists the other files (name, bytes, crc32).
inline constexpr const char* files_key = "__loom_shard_files__";

// Rank 0's part of staging a multi-file save: removes what saves that died
// before publishing left in `parent` (entries named prefix...), then creates
// a fresh parent/prefix<pid>-<stamp>. Returns its path, or "!why".
std::string fresh_staging_directory(const std::string& parent, const std::string& prefix);
// Rank 0's answer (a staging path, or "!why") broadcast over group; every
// rank throws the same checkpoint_error for "!why", so none writes anything.
std::string agree_on_staging(const std::string& path, std::string answer, comm::process_group& group);

struct listed_file {
  std::string name;
  std::int64_t bytes = -1;  // -1: the slot holds no file
  std::int64_t crc32 = 0;
};

// A checkpoint file of entries written atomically to staged/name as it is
// serialised (write_entries), and its record.
listed_file write_listed(const std::filesystem::path& staged, const std::string& name,
                         const c10::impl::GenericDict& entries);

// Every rank's records, rank by rank, slot by slot (each rank passes the same
// number of slots; empty slots are left out): what the index lists.
// Collective over group; the reports travel on the group's device (NCCL's)
// and are read on the CPU. name_of names another rank's slot.
std::vector<listed_file> gather_listed(comm::process_group& group, const std::vector<listed_file>& mine,
                                       const std::function<std::string(int rank, std::size_t slot)>& name_of);
// The list as an index stores it under files_key.
c10::IValue listed_value(const std::vector<listed_file>& files);

// The files the index (read from index_path) lists, each entry checked.
std::vector<listed_file> listed_files(const checkpoint_contents& index, const std::filesystem::path& index_path);
// One of them, present in directory (a regular file of the directory
// itself) and of the size listed; read, or mapped. Its CRC32 is the
// caller's to check: over the whole file (read_listed), or record by record
// over what a rank reads of it (local_parts.cpp).
file_bytes open_listed(const confined_directory& directory, const listed_file& file, const checkpoint_contents& index,
                       const std::filesystem::path& index_path, bool map_file);
// A listed file's contents come from the index's save (same world size).
void check_same_save(const checkpoint_contents& contents, const checkpoint_contents& index, const std::string& path,
                     const std::filesystem::path& index_path);

// The files index (read from index_path) lists in directory: each checked
// (a regular file of the directory itself, its size, its CRC32) before any
// is parsed, then parsed; each must have been written by a job of the
// index's world size. Pairs of (file name, contents), in listed order.
// map_files: the files are mapped, not read, and their tensors lie over
// their pages (nothing of them on the heap; consolidate).
std::vector<std::pair<std::string, checkpoint_contents>> read_listed(const confined_directory& directory,
                                                                     const checkpoint_contents& index,
                                                                     const std::filesystem::path& index_path,
                                                                     bool map_files = false);

}  // namespace loom::detail
