// A checkpoint file's bytes: what save_checkpoint writes and read_checkpoint
// parses, apart from where they go, so that sharded saves (one file per
// rank, sharded.cpp) and consolidation share them. Internal to src/checkpoint.
#pragma once

#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/state.hpp>

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace loom::detail {

// The entry holding loom's metadata in every checkpoint file.
inline constexpr const char* metadata_key = "__loom__";

std::vector<char> read_file(const std::string& path);
c10::IValue metadata_value(const checkpoint_metadata& metadata);
// state serialised (with filter), as save_checkpoint writes it; path names
// the checkpoint in errors.
std::vector<char> serialize_checkpoint(const std::string& path, const state& state, const state_filter& filter,
                                       const checkpoint_metadata& metadata);
// The same, naming optimizer state by the parameter names of names_from's
// modules (a file holding optimizers without their modules).
std::vector<char> serialize_checkpoint(const std::string& path, const state& state, const state_filter& filter,
                                       const checkpoint_metadata& metadata, const loom::state& names_from);
// Bytes read from path, verified and parsed.
checkpoint_contents parse_checkpoint(const std::vector<char>& bytes, const std::string& path);

// The entry listing a multi-file checkpoint's other files (name, bytes, crc32).
inline constexpr const char* files_key = "__loom_shard_files__";
// Rank 0's part of staging a multi-file save: removes what saves that died
// before publishing left in `parent` (entries named prefix...), then creates
// a fresh parent/prefix<pid>-<stamp>. Returns its path, or "!why".
std::string fresh_staging_directory(const std::string& parent, const std::string& prefix);
// Rank 0's answer (a staging path, or "!why") broadcast over group; every
// rank throws the same checkpoint_error for "!why", so none writes anything.
std::string agree_on_staging(const std::string& path, std::string answer, comm::process_group& group);

// Every rank's contents into one: tensors with a range in the first rank's
// metadata.shards concatenated in range order, the rest taken from it.
checkpoint_contents merge_shards(std::vector<checkpoint_contents>& ranks, const std::string& path);

}  // namespace loom::detail
