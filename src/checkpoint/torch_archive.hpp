// The single-file checkpoint format: a torch zip archive (data.pkl + data/<n>
// records) that Python's torch.load(path) opens, with weights_only=True too,
// and that loom reads back after checking every record's CRC32. Internal to
// src/checkpoint.
#pragma once

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

// A checkpoint_error that names the file: "checkpoint PATH: why".
[[noreturn]] void fail_checkpoint(const std::string& path, const std::string& why);

// Whether bytes are a LibTorch archive written by torch::save(module or
// optimizer) (it has constants.pkl), read in place.
bool is_libtorch_archive(const std::vector<char>& bytes);

// root pickled without TorchScript's type tags and with every list generic,
// so only globals torch.load's weights_only unpickler allows appear.
// The archive goes to sink record by record: the pickle is built in memory
// (its size is the structure's, not the tensors'), each tensor's bytes are
// written from its storage.
// materialize, when given, says what to write for each stored tensor
// (deferred_tensors::materialize): each is dropped once written.
void write_torch_archive(const c10::IValue& root, const std::function<void(const char*, std::size_t)>& sink,
                         const std::function<at::Tensor(const at::Tensor&)>& materialize = nullptr);
std::vector<char> write_torch_archive(const c10::IValue& root);

// loom's walk of the zip: every entry's bounds, no overlaps, names matching
// their local headers, once each, stored and unencrypted; the folder's
// version record; then every record's CRC32 against the central directory
// (torch.load and LibTorch do not check them). A truncated, corrupted or
// forged file is a checkpoint_error naming path and the record.
class structure_budget;
void verify_zip_records(std::span<const char> bytes, const std::string& path);
void verify_zip_records(std::span<const char> bytes, const std::string& path, structure_budget& budget);

// Reads an archive written by loom, LibTorch or Python's torch.save, from
// the records verify_zip_records found (LibTorch's zip reader is not used):
// the pickle is checked and rewritten by python_pickle.hpp, then unpickled by
// LibTorch, then every tensor view is checked (tensor_records.hpp).
// Its zip index and pickle walk are charged to a structure budget
// (structure_budget.hpp): the second form takes one the caller reads.
c10::IValue read_torch_archive(std::span<const char> bytes, const std::string& path);
// With a backing (what keeps bytes alive: a mapped file), the storages lie
// over bytes themselves instead of copies, each holding the backing; bytes
// must then be writable copy-on-write pages (mapped_file).
c10::IValue read_torch_archive(std::span<const char> bytes, const std::string& path, structure_budget& budget,
                               std::shared_ptr<const void> backing = nullptr);
// A storage record read_torch_archive_structure left unread: the record's
// name, where its bytes lie in the file, the CRC32 the zip directory gives
// them and, where loom wrote the file, the CRC32 of each of its blocks
// (block_crc.hpp; block_bytes 0: none, the record is checked whole); keyed
// by the storage's first byte in the mapping (the data pointer of every
// tensor over it).
struct unread_record {
  std::string name;
  std::uint64_t offset = 0, bytes = 0;
  std::uint32_t crc = 0;
  std::uint64_t block_bytes = 0;
  std::vector<std::uint32_t> block_crcs;
};
using unread_records = std::unordered_map<const void*, unread_record>;
// The archive's structure without its tensors' bytes (a rank that reads
// only its parts, local_parts.cpp): the zip walk and every record but the
// storages are checked as above; each storage lies over bytes (a mapped
// file), untouched whatever its alignment, and is listed in unread. Nothing
// may compute on those tensors: their bytes are unverified.
c10::IValue read_torch_archive_structure(std::span<const char> bytes, const std::string& path,
                                         structure_budget& budget, std::shared_ptr<const void> backing,
                                         unread_records& unread);
// The deleter of the storages that lie over a backing, and whether a
// tensor's storage is one of them (its pages are a mapped file's).
void release_backing(void* held);
bool lies_over_backing(const at::Tensor& tensor);

}  // namespace loom::detail
