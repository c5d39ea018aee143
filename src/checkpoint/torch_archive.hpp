// The single-file checkpoint format: a torch zip archive (data.pkl + data/<n>
// records) that Python's torch.load(path) opens, with weights_only=True too,
// and that loom reads back after checking every record's CRC32. Internal to
// src/checkpoint.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace loom::detail {

// A checkpoint_error that names the file: "checkpoint PATH: why".
[[noreturn]] void fail_checkpoint(const std::string& path, const std::string& why);

// Whether bytes are a LibTorch archive written by torch::save(module or
// optimizer) (it has constants.pkl), read in place.
bool is_libtorch_archive(const std::vector<char>& bytes);

// root pickled without TorchScript's type tags and with every list generic,
// so only globals torch.load's weights_only unpickler allows appear.
std::vector<char> write_torch_archive(const c10::IValue& root);

// Every stored record's CRC32 against the zip's central directory (torch.load
// and LibTorch do not check them); a truncated or corrupted file is a
// checkpoint_error naming path and the record.
void verify_zip_records(const std::vector<char>& bytes, const std::string& path);

// Reads a verified archive written by loom, LibTorch or Python's torch.save:
// Python's one-element lists and one-key dicts are rewritten for LibTorch
// 1.13's unpickler first (python_pickle.hpp).
c10::IValue read_torch_archive(const std::vector<char>& bytes, const std::string& path);

}  // namespace loom::detail
