// ZeRO checkpoints under DeepSpeed's file names (io.hpp): PATH/latest and
// PATH/<tag>/ with model-states and optim-states files, the contents in
// loom's format. As sharded.cpp: staged beside the tag, published in one
// step, verified (size and CRC32, listed in rank 0's model-states file,
// which is written last) before anything is parsed, and read back at full
// size by concatenating each tensor's slices in range order.
#include <loom/checkpoint/io.hpp>
#include <loom/errors.hpp>

#include "checkpoint_bytes.hpp"
#include "file_bytes.hpp"
#include "manifest.hpp"
#include "torch_archive.hpp"

#include <ATen/ATen.h>


#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

namespace loom {
namespace fs = std::filesystem;
using detail::fail_checkpoint;
using detail::files_key;

namespace {

constexpr const char* tag = "checkpoint";  // Lightning's tag
constexpr const char* latest_file = "latest";
constexpr const char* whole_model_file = "mp_rank_00_model_states.pt";

std::string model_file(int rank) { return "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_model_states.pt"; }
std::string optim_file(int rank, bool bf16) {
  return std::string(bf16 ? "bf16_" : "") + "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_optim_states.pt";
}

// The optim-states files' entries (optimizers and the partition entries),
// or the model-states files' (the rest).
state subset(const state& all, const deepspeed_layout& layout, bool optimizers) {
  state out;
  for (const auto& entry : all.entries()) {
    const bool partition = entry.io().optimizer() != nullptr || layout.partition_entries.count(entry.name()) > 0;
    if (partition == optimizers) out.add(entry);
  }
  return out;
}

// The layout's filter restricted to the entries of part (a filter naming an
// entry the state lacks is an error).
state_filter filter_for(const state& part, const deepspeed_layout& layout) {
  state_filter out;
  for (const auto& [name, keep] : layout.filter) {
    if (part.contains(name)) out[name] = keep;
  }
  return out;
}

// The tag 'latest' names: one line, a name in the directory.
std::string read_tag(const detail::confined_directory& root) {
  const std::string path = root.path();
  const auto bytes = root.read(latest_file, 4096);
  if (!bytes) fail_checkpoint(path, "has no 'latest' file (it must name the tag directory)");
  std::string text(bytes->begin(), std::find(bytes->begin(), bytes->end(), '\n'));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  if (text.empty()) fail_checkpoint(path, "has an empty 'latest' file (it must name the tag directory)");
  if (text.find('/') != std::string::npos || text == "." || text == "..") {
    fail_checkpoint(path, "'latest' names '" + text + "', which is not a tag directory inside it");
  }
  return text;
}

}  // namespace

bool is_deepspeed_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / latest_file, ec);
}

void save_deepspeed_checkpoint(const std::string& path, const state& state, const checkpoint_metadata& metadata,
                               const deepspeed_layout& layout, comm::process_group& group,
                               const std::function<void(const std::function<void()>&)>& with_full_module) {
  const int rank = group.valid() ? group.rank() : 0;
  const int world = group.valid() ? group.size() : 1;
  // Rank 0 prepares PATH and the staging directory; every rank learns the
  // answer (an error included) before anything is written.
  std::string answer;
  if (rank == 0) {
    std::error_code ec;
    const fs::path root = fs::absolute(path);
    if (fs::exists(root, ec) && !fs::is_directory(root, ec)) {
      answer = "!is a file; a ZeRO checkpoint is a directory (DeepSpeed's layout): choose another path";
    } else if (fs::is_directory(root, ec) && !is_deepspeed_checkpoint(path) && !fs::is_empty(root, ec)) {
      answer = "!is a non-empty directory without 'latest' (not a DeepSpeed-layout checkpoint); loom replaces only "
               "its own checkpoints: choose another path or remove it";
    } else {
      fs::create_directories(root, ec);
      answer = detail::fresh_staging_directory(root.string(), std::string(tag) + ".tmp-");
    }
  }
  const fs::path staged = detail::agree_on_staging(path, answer, group);

  checkpoint_metadata mine = metadata;
  mine.global_rank = rank;
  mine.world_size = world;
  mine.shards = layout.shards;
  auto write = [&](const std::string& name, const loom::state& part) {
    return detail::write_listed(staged, name, detail::checkpoint_entries(path, part, filter_for(part, layout), mine, state));
  };
  // Every file but rank 0's model states: the optim file, then the model
  // file (stage 3; none elsewhere).
  std::vector<detail::listed_file> mine_written{write(optim_file(rank, layout.bf16), subset(state, layout, true)),
                                                detail::listed_file{}};
  if (layout.module_sharded && rank != 0) mine_written[1] = write(model_file(rank), subset(state, layout, false));
  const auto files = detail::gather_listed(group, mine_written, [&](int r, std::size_t slot) {
    return slot == 0 ? optim_file(r, layout.bf16) : model_file(r);
  });

  // Rank 0's model states, last, listing the others.
  auto write_index = [&] {
    if (rank != 0) return;
    checkpoint_metadata described = mine;
    if (!layout.module_sharded) described.shards.clear();  // the module is whole in this file
    const loom::state modules = subset(state, layout, /*optimizers=*/false);
    auto entries = detail::checkpoint_entries(path, modules, filter_for(modules, layout), described);
    entries.insert(files_key, detail::listed_value(files));
    detail::write_entries((staged / (layout.module_sharded ? model_file(0) : whole_model_file)).string(), entries);
  };
  if (layout.module_sharded) write_index();
  else with_full_module(write_index);
  if (rank == 0) {
    publish_directory(staged.string(), (fs::path(path) / tag).string());
    const std::string text = std::string(tag) + "\n";
    write_file_atomically((fs::path(path) / latest_file).string(), std::vector<char>(text.begin(), text.end()));
  }
  if (group.valid()) group.barrier();
}

checkpoint_contents read_deepspeed_checkpoint(const std::string& path) { return detail::read_deepspeed(path, nullptr); }

namespace {

// The tag directory of a DeepSpeed-layout checkpoint and the name of its
// index (rank 0's model states, which lists every other file).
struct deepspeed_tag {
  detail::confined_directory root, directory;
  std::string index_name;
  fs::path index_path() const { return fs::path(directory.path()) / index_name; }
};

deepspeed_tag open_tag(const std::string& path) {
  if (!is_deepspeed_checkpoint(path)) {
    fail_checkpoint(path, "is not a DeepSpeed-layout checkpoint (a directory holding 'latest' and the tag directory "
                          "it names)");
  }
  detail::confined_directory root(path, &fail_checkpoint);
  detail::confined_directory directory = root.subdirectory(read_tag(root));
  std::string index_name = directory.has(model_file(0)) ? model_file(0) : std::string(whole_model_file);
  return {std::move(root), std::move(directory), std::move(index_name)};
}

[[noreturn]] void fail_no_index(const deepspeed_tag& tag) {
  fail_checkpoint(tag.directory.path(), "has neither " + std::string(whole_model_file) + " nor " + model_file(0) +
                                            " (a save that did not finish, or not loom's); nothing was changed");
}

// Where a listed file goes: an optimizer file's rank, or -1 for a model file.
int optimizer_rank(const std::string& name, const checkpoint_contents& contents, int world, const std::string& path) {
  if (name.find("_optim_states.pt") == std::string::npos) return -1;
  const std::int64_t r = contents.metadata.global_rank;
  if (r < 0 || r >= world) fail_checkpoint(path, "names rank " + std::to_string(r) + " of " + std::to_string(world));
  return static_cast<int>(r);
}

}  // namespace

detail::deepspeed_unread detail::read_deepspeed_unread(const std::string& path) {
  const deepspeed_tag tag = open_tag(path);
  auto index = tag.directory.map(tag.index_name);
  if (!index) fail_no_index(tag);
  deepspeed_unread out;
  unread_file first = parse_unread(std::move(*index), tag.index_path().string());
  const checkpoint_contents& meta = first.contents;
  const int world = static_cast<int>(meta.metadata.world_size);
  std::vector<std::optional<unread_file>> optim(static_cast<std::size_t>(std::max(world, 0)));
  for (const listed_file& listed : listed_files(meta, tag.index_path())) {
    file_bytes opened = open_listed(tag.directory, listed, meta, tag.index_path(), /*map_file=*/true);
    unread_file file = parse_unread(std::move(opened.mapped), tag.directory.path_of(listed.name));
    check_same_save(file.contents, meta, file.path, tag.index_path());
    const int r = optimizer_rank(listed.name, file.contents, world, file.path);
    if (r >= 0) optim[static_cast<std::size_t>(r)] = std::move(file);
    else out.model.push_back(std::move(file));
  }
  for (std::size_t r = 0; r < optim.size(); ++r) {
    if (!optim[r]) fail_checkpoint(tag.directory.path(), "has no optimizer file of rank " + std::to_string(r));
    out.optim.push_back(std::move(*optim[r]));
  }
  out.model.insert(out.model.begin(), std::move(first));
  std::stable_sort(out.model.begin(), out.model.end(), [](const unread_file& a, const unread_file& b) {
    return a.contents.metadata.global_rank < b.contents.metadata.global_rank;
  });
  return out;
}

checkpoint_contents detail::read_deepspeed(const std::string& path, deferred_tensors* deferred) {
  const deepspeed_tag opened = open_tag(path);
  const detail::confined_directory& tag = opened.directory;
  const fs::path directory = tag.path();
  const bool sharded_module = opened.index_name == model_file(0);
  const std::string& index_name = opened.index_name;
  const fs::path index_path = opened.index_path();
  // Rank 0's model states (stage 3: its module slices) mapped like the
  // files it lists when the merge is deferred.
  auto index_bytes = tag.load(index_name, /*map_file=*/deferred != nullptr);
  if (!index_bytes) fail_no_index(opened);
  checkpoint_contents index = detail::parse_checkpoint(index_bytes->bytes(), index_path.string(), index_bytes->mapped);
  index_bytes.reset();
  const int world = static_cast<int>(index.metadata.world_size);
  std::vector<checkpoint_contents> optim(static_cast<std::size_t>(world));
  std::vector<checkpoint_contents> model{index};
  for (auto& [name, contents] : detail::read_listed(tag, index, index_path, /*map_files=*/deferred != nullptr)) {
    const int r = optimizer_rank(name, contents, world, (directory / name).string());
    if (r >= 0) optim[static_cast<std::size_t>(r)] = std::move(contents);
    else model.push_back(std::move(contents));
  }
  for (std::size_t r = 0; r < optim.size(); ++r) {
    if (optim[r].metadata.world_size == 0) {
      fail_checkpoint(directory.string(), "has no optimizer file of rank " + std::to_string(r));
    }
  }
  // The module: merged from every rank's slices (stage 3), or rank 0's whole.
  (void)model.front().entries.erase(files_key);
  std::sort(model.begin(), model.end(), [](const checkpoint_contents& a, const checkpoint_contents& b) {
    return a.metadata.global_rank < b.metadata.global_rank;
  });
  checkpoint_contents out = sharded_module ? detail::merge_shards(model, path, deferred) : model.front();
  checkpoint_contents optimizers = detail::merge_shards(optim, path, deferred);
  for (const auto& item : optimizers.entries) out.entries.insert_or_assign(item.key(), item.value());
  out.metadata.shards.clear();
  out.metadata.global_rank = 0;
  for (const auto& [entry, type] : optim.front().metadata.optimizer_types) out.metadata.optimizer_types[entry] = type;
  return out;
}

}  // namespace loom
