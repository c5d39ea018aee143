// Reading and writing checkpoints. Files are written to a temporary name in
// the same directory, flushed and renamed, so a crash never leaves a partial
// file in place of a good one; reads check every record's CRC32 before
// anything in memory changes.
#pragma once

#include <loom/checkpoint/state.hpp>
#include <loom/comm/process_group.hpp>

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace loom {

// 2: a torch zip archive Python's torch.load(path) opens (weights_only=True
// too): {"__loom__": metadata, <entry name>: <entry state>, ...}, modules as
// state dicts, SGD/Adam/AdamW/RMSprop/Adagrad in torch.optim's layout keyed
// by parameter name. 1: a 24-byte header before a torch::pickle_save archive
// (still read).
inline constexpr std::int64_t checkpoint_format_version = 2;

// The slice of a flattened parameter one rank's file of a sharded
// checkpoint holds: elements [begin, end) of a tensor of `shape`. Under
// tensor parallelism (dim >= 0) the flattened tensor is this rank's chunk
// `part` of `parts` along `dim` of the full tensor of `shape` (its chunk(parts,
// dim)[part]), itself possibly sliced by a data-parallel engine.
struct shard_range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::vector<std::int64_t> shape;
  std::int64_t dim = -1;
  std::int64_t part = 0;
  std::int64_t parts = 1;
};
// Parameter name (as in its module's state dict) -> this rank's slice.
using shard_layout = std::map<std::string, shard_range>;

struct checkpoint_metadata {
  std::int64_t world_size = 1;
  std::int64_t global_rank = 0;
  std::string strategy;
  std::string precision;
  // Entry name -> the optimizer's C++ type, checked on load.
  std::map<std::string, std::string> optimizer_types;
  // In a sharded checkpoint's rank files: the slices that file holds.
  shard_layout shards;
};

// Writes bytes to path atomically (temporary file, fsync, rename, fsync dir).
void write_file_atomically(const std::string& path, const std::vector<char>& bytes);

// Puts the complete directory (or file) `staged` at `path` in one step: a
// rename when path does not exist, renameat2(RENAME_EXCHANGE) when it does (a
// plain rename fails on a non-empty directory), then removes what path held
// before. At every instant path is the complete old or the complete new
// checkpoint, for saves of several files (sharded strategies). Both must be
// on one file system; staged is typically PATH.tmp-<id> beside path.
void publish_directory(const std::string& staged, const std::string& path);

// Serialises state (with filter) and writes it atomically.
void save_checkpoint(const std::string& path, const state& state, const state_filter& filter,
                     const checkpoint_metadata& metadata);

// Reads and verifies a checkpoint file: the entries dict and its metadata.
struct checkpoint_contents {
  c10::impl::GenericDict entries{c10::StringType::get(), c10::AnyType::get()};
  checkpoint_metadata metadata;
};
checkpoint_contents read_checkpoint(const std::string& path);

// Writes contents (entries and metadata) as one checkpoint file, atomically.
void write_checkpoint(const std::string& path, const checkpoint_contents& contents);

// ----------------------------------------------------------- sharded
// A directory holding meta.pt and one file per rank (sharded strategies'
// state_dict_type="sharded"); load_checkpoint reads one by itself.
bool is_sharded_checkpoint(const std::string& path);

// Collective over group: each rank writes state as it holds it (its slices
// of the parameters in `layout`, whole tensors otherwise) into PATH.tmp-<id>/,
// rank 0 writes meta.pt last (each file's size and CRC32) and publishes the
// directory at path in one step. A path that holds a directory other than a
// loom sharded checkpoint is refused.
void save_sharded_checkpoint(const std::string& path, const state& state, const checkpoint_metadata& metadata,
                             const shard_layout& layout, comm::process_group& group);

// A sharded checkpoint's contents at full size (each parameter's and
// optimizer-state tensor's slices concatenated), whatever the world size
// that wrote it. Every rank file is checked against meta.pt first; a
// missing, torn or corrupted file is a checkpoint_error naming it.
checkpoint_contents read_sharded_checkpoint(const std::string& directory);

// loom-consolidate's work: the full checkpoint of a sharded one, or of a ZeRO
// one in DeepSpeed's layout, written atomically to output, byte for byte
// what write_checkpoint(output, read_sharded_checkpoint(input)) (or
// read_deepspeed_checkpoint) writes, holding one full tensor at a time: the
// rank files are mapped and checked (size, CRC32) before anything is
// written, and each merged tensor is assembled from their pages as its
// record is written, then dropped. Returns the written file's metadata and
// its number of entries.
struct consolidated_checkpoint {
  checkpoint_metadata metadata;
  std::size_t entries = 0;
};
consolidated_checkpoint consolidate_checkpoint(const std::string& input, const std::string& output);

// ----------------------------------------------------------- DeepSpeed's layout
// ZeRO's checkpoints under DeepSpeed's file names with Lightning's tag:
// PATH/latest holds the tag, PATH/checkpoint/ holds mp_rank_00_model_states.pt
// (rank 0: the whole module and the other state; stages 0-2) or
// zero_pp_rank_{r}_mp_rank_00_model_states.pt (each rank's module slices,
// stage 3), and zero_pp_rank_{r}_mp_rank_00_optim_states.pt (each rank's
// optimizer slices; "bf16_" in front under bf16). The contents are loom's.
bool is_deepspeed_checkpoint(const std::string& path);

struct deepspeed_layout {
  bool module_sharded = false;  // stage 3: each rank writes its module slices
  bool bf16 = false;            // the optimizer files' names start with bf16_
  shard_layout shards;          // this rank's slices (parameters and their optimizer state)
  // Entries that are this rank's partition (name-keyed slices, as the
  // optimizer's state): written to the optim-states files with it (the fp32
  // masters of bf16 mode).
  std::set<std::string> partition_entries;
  // Applied to the module entries (exclude_frozen_parameters).
  state_filter filter;
};

// Collective over group. The tag is staged as PATH/checkpoint.tmp-<id>/ and
// published in one step, then PATH/latest is rewritten atomically, last: at
// every instant PATH holds the complete old or the complete new checkpoint.
// Rank 0's model-states file, written after every other, lists every other
// file's size and CRC32. For stages 0-2, with_full_module(body) must run body
// with the module parameters whole on rank 0 (every rank calls it).
void save_deepspeed_checkpoint(const std::string& path, const state& state, const checkpoint_metadata& metadata,
                               const deepspeed_layout& layout, comm::process_group& group,
                               const std::function<void(const std::function<void()>&)>& with_full_module);

// Its contents at full size, whatever the world size that wrote it; every
// file is checked (present, size, CRC32) before any is parsed.
checkpoint_contents read_deepspeed_checkpoint(const std::string& path);

// Restores every entry of `target` from the file, all or nothing: on any error
// (missing file, corruption, a missing key with strict, a shape or type
// mismatch) it throws loom::checkpoint_error and nothing has changed. Returns
// the checkpoint's entries that `target` did not ask for, as owned values.
// A sharded checkpoint directory loads the same way, at full size.
state load_checkpoint(const std::string& path, const state& target, bool strict = true);

// ----------------------------------------------------------- a rank's parts
// What this rank holds of a split parameter: the range it saves (the full
// shape, its tensor-parallel chunk, the chunk's flat elements) and the
// shape its part lives in.
struct rank_part {
  shard_range range;
  std::vector<std::int64_t> shape;
};
// Parameter name -> this rank's part of it (and of its optimizer state).
using rank_parts = std::map<std::string, rank_part>;

// The bytes a rank's read of its parts holds of a file at a time.
inline constexpr std::size_t local_read_buffer_bytes = std::size_t{4} << 20;

// The checkpoint at path (a full file, a sharded directory of any world
// size, or ZeRO's in DeepSpeed's layout) as one rank loads it: each tensor
// of a parameter named in `mine` (in a module's state dict, in a dict keyed
// by parameter name such as ZeRO's fp32 masters, and each per-parameter
// optimizer state tensor) is this rank's part of it, shaped as mine says;
// every other tensor is whole. The files are read record by record through
// one buffer of local_read_buffer_bytes: of the records holding elements of
// this rank's parts only the blocks holding them (64 KiB, each checked
// against its CRC32 in loom's block table; a file without one, whole,
// checked against the zip's CRC32; only those elements kept), and the
// unsplit state from rank 0's file;
// nothing of a file is parsed before the index's size for it is checked
// (meta.pt; in DeepSpeed's layout rank 0's model states, and the
// model-states and optim-states files are read as two groups). A file in
// loom's earlier format is read whole, then cut.
//
// How: verify_only reads and checks every record a part needs and copies
// nothing (the parts are then tensors without storage, on the meta device:
// their shape and dtype, which is what validation reads); the unsplit state
// is read either way. into(entry, name, field) names the tensor a part is
// read into instead of a fresh one (the live parameter's part, its live
// optimizer state; field "" in a state dict), used when it has the part's
// shape and dtype.
struct local_read {
  bool verify_only = false;
  std::function<at::Tensor(const std::string& entry, const std::string& name, const std::string& field)> into;
};
checkpoint_contents read_local_parts(const std::string& path, const rank_parts& mine, const local_read& how = {});

// load_checkpoint for one rank of a sharded strategy, whose split
// parameters hold this rank's parts (`mine`). Collective over group: each
// rank first reads what it needs with verify_only and validates it against
// target; only when every rank did does any load, otherwise every rank
// throws a checkpoint_error (naming the ranks that failed) and none changed
// anything. Then each reads its parts again, straight into its parameters'
// parts and its optimizers' state (into), so a load holds no second copy of
// the state: the rank's state plus one buffer. A file that changes between
// the two reads is caught by the second's CRC32s, with this rank's state then
// partly loaded (the error says so).
state load_local_parts(const std::string& path, const state& target, const rank_parts& mine, bool strict,
                       comm::process_group& group);

// A full checkpoint of a state whose split parameters each rank holds a
// part of (a sharded strategy's full save), written to path by the rank
// with `writes`, one full tensor at a time. Collective: every rank calls it
// with the same state; each tensor of a parameter named in `mine` (as in
// read_local_parts) is made whole by gather(name, part), a collective every
// rank calls for the same tensors in the same order, only when its record
// is written, and dropped after. The writer holds its state and one full
// tensor; the file is the one the whole state would give.
void save_gathered_checkpoint(const std::string& path, const state& state, const state_filter& filter,
                              const checkpoint_metadata& metadata, const rank_parts& mine,
                              const std::function<at::Tensor(const std::string& name, const at::Tensor& part)>& gather,
                              bool writes);

// While one lives (on this thread), loaded optimizer state that is floating
// takes dtype instead of its parameter's (torch.optim's rule). DeepSpeed's
// bf16 mode: the optimizer steps fp32 masters of bf16 parameters.
class optimizer_state_dtype {
 public:
  explicit optimizer_state_dtype(at::ScalarType dtype);
  optimizer_state_dtype(const optimizer_state_dtype&) = delete;
  optimizer_state_dtype& operator=(const optimizer_state_dtype&) = delete;
  ~optimizer_state_dtype();

 private:
  std::optional<at::ScalarType> previous_;
};

// A state dict written by LibTorch's torch::save(module, path) or by Python's
// torch.save(dict(module.state_dict()), path), loaded into module.
void load_raw_module(const std::string& path, torch::nn::Module& module, bool strict = true);
// An optimizer written by LibTorch's torch::save(optimizer, path).
void load_raw_optimizer(const std::string& path, torch::optim::Optimizer& optimizer);

}  // namespace loom
