// One function per parser that takes bytes from outside, shared by the
// libFuzzer binaries (tests/fuzz/build.sh: clang, sanitizers, coverage
// feedback) and the corpus replay of `meson test` (tests/fuzz/replay.cpp).
// Each feeds the bytes to loom's reader and catches only the error type
// that reader documents: anything else escaping (a c10::Error, a
// std::bad_alloc, a nlohmann exception) ends the run as a finding, as does
// a crash, a hang or a sanitizer report.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom_fuzz {

using target_function = int (*)(const std::uint8_t* data, std::size_t size);

struct target {
  const char* name;
  target_function run;
};

// The bytes as a pickle: loom's walk (validate_and_fix_pickle).
int pickle(const std::uint8_t* data, std::size_t size);
// The bytes as a torch zip archive (read_torch_archive).
int archive(const std::uint8_t* data, std::size_t size);
// The bytes as a checkpoint file loaded into a model, an Adam optimizer and
// plain values (load_checkpoint, what fabric.load calls).
int load(const std::uint8_t* data, std::size_t size);
// The bytes as meta.pt of a sharded checkpoint whose rank file is real.
int sharded_index(const std::uint8_t* data, std::size_t size);
// The bytes as the rank file of a one-rank sharded checkpoint whose slices
// are listed (each parameter a flattened range), fitted to the size meta.pt
// records (cut, or padded with zeros): the merge of rank files' slices.
int sharded_rank(const std::uint8_t* data, std::size_t size);
// The bytes as the model-states index of a DeepSpeed-layout checkpoint
// whose other files are real.
int deepspeed_index(const std::uint8_t* data, std::size_t size);
// The bytes as a checkpoint file one rank of two reads its half of each
// parameter (and of its Adam state) from (read_local_parts: the structure
// parsed with the tensors unread, loom's block table, ranged reads).
int local_parts(const std::uint8_t* data, std::size_t size);
// The bytes as a DeepSpeed JSON config (resolve_zero_config), under 32-true,
// 16-mixed and bf16-mixed.
int zero_config(const std::uint8_t* data, std::size_t size);
// The bytes as an IDX file, plain or gzipped (read_idx).
int idx(const std::uint8_t* data, std::size_t size);

inline constexpr target targets[] = {
    {"pickle", &pickle},
    {"archive", &archive},
    {"load", &load},
    {"sharded_index", &sharded_index},
    {"sharded_rank", &sharded_rank},
    {"deepspeed_index", &deepspeed_index},
    {"local_parts", &local_parts},
    {"zero_config", &zero_config},
    {"idx", &idx},
};

// Writes seed files for every target under DIR/<target>/: checkpoints loom
// writes (single-file, both indexes), and the pickle inside one.
void write_seeds(const char* directory);

}  // namespace loom_fuzz
