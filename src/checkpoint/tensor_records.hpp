// The storages an archive's pickle asks for, and the tensor views built over
// them, held to the bytes the records really have. LibTorch 1.13's
// unpickler sizes each storage by the numel the pickle states, whatever the
// record holds, and sets each tensor's offset, sizes and strides as stated:
// a forged file could make a tensor read heap memory past its record. Each
// record is read once (a pickle that names one record a thousand times gets
// one buffer, shared), and before anything reads a tensor every view is
// checked against the record under it. Internal to src/checkpoint.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

namespace loom::detail {

// Whether tensor's storage is a record that tensor_records handed out whose
// own buffer is freed by deleter (what the reader gave it).
bool record_deleted_by(const at::Tensor& tensor, at::DeleterFnPtr deleter);

class tensor_records {
 public:
  // read(name) returns the record's bytes (caffe2's PyTorchStreamReader).
  using reader = std::function<std::tuple<at::DataPtr, std::size_t>(const std::string& name)>;
  explicit tensor_records(reader read) : read_(std::move(read)) {}

  // The unpickler's read_record: the record's buffer, read on its first use
  // and shared by every later one.
  at::DataPtr operator()(const std::string& name);

  // Every tensor in value lies inside the record its storage came from:
  // its storage is no larger than the record, its sizes and strides are not
  // negative and its last element is inside the storage; and value is a
  // tree no deeper than unpickled_value.hpp's limit. Otherwise value is taken
  // apart (so its destruction cannot recurse deeply) and a checkpoint_error
  // names path and the place.
  void check_views(c10::IValue& value, const std::string& path) const;

 private:
  struct record {
    std::shared_ptr<at::DataPtr> buffer;
    std::size_t bytes = 0;
    std::string name;
  };
  reader read_;
  std::unordered_map<std::string, record> by_name_;
  std::unordered_map<const void*, const record*> by_address_;
};

}  // namespace loom::detail
