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

// Every rank's contents into one: tensors with a range in the first rank's
// metadata.shards concatenated in range order, the rest taken from it.
checkpoint_contents merge_shards(std::vector<checkpoint_contents>& ranks, const std::string& path);

}  // namespace loom::detail
