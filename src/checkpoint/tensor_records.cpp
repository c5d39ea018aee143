#include "tensor_records.hpp"

#include "torch_archive.hpp"
#include "unpickled_value.hpp"
#include "view_extent.hpp"

#include <ATen/ATen.h>

#include <optional>
#include <utility>
#include <vector>

namespace loom::detail {

namespace {

void release_shared(void* context) { delete static_cast<std::shared_ptr<at::DataPtr>*>(context); }

std::string view_text(const at::Tensor& tensor) {
  std::string text = "sizes [";
  for (int64_t d = 0; d < tensor.dim(); ++d) text += (d ? ", " : "") + std::to_string(tensor.sizes()[static_cast<std::size_t>(d)]);
  text += "], strides [";
  for (int64_t d = 0; d < tensor.dim(); ++d) text += (d ? ", " : "") + std::to_string(tensor.strides()[static_cast<std::size_t>(d)]);
  return text + "], offset " + std::to_string(tensor.storage_offset());
}

}  // namespace

bool record_deleted_by(const at::Tensor& tensor, at::DeleterFnPtr deleter) {
  if (!tensor.defined() || !tensor.has_storage()) return false;
  const at::DataPtr& outer = tensor.storage().data_ptr();
  if (outer.get_deleter() != &release_shared) return false;
  const auto* held = static_cast<const std::shared_ptr<at::DataPtr>*>(outer.get_context());
  return *held && (*held)->get_deleter() == deleter;
}

at::DataPtr tensor_records::operator()(const std::string& name) {
  auto& held = by_name_[name];
  if (!held.buffer) {
    auto [data, bytes] = read_(name);
    held.buffer = std::make_shared<at::DataPtr>(std::move(data));
    held.bytes = bytes;
    held.name = name;
    by_address_[held.buffer->get()] = &held;
  }
  void* data = held.buffer->get();
  return at::DataPtr(data, new std::shared_ptr<at::DataPtr>(held.buffer), &release_shared, c10::Device(c10::kCPU));
}

void tensor_records::check_views(c10::IValue& value, const std::string& path) const {
  std::optional<std::string> refusal;
  const auto visit = [&](const c10::IValue& item, const std::string& place) {
    if (refusal || !item.isTensor()) return;
    const at::Tensor& tensor = item.toTensor();
    if (!tensor.defined() || !tensor.has_storage()) return;
    const at::Storage& storage = tensor.storage();
    const auto found = by_address_.find(storage.data());
    const std::size_t record_bytes = found == by_address_.end() ? 0 : found->second->bytes;
    const std::string record_name = found == by_address_.end() ? "no record" : "record data/" + found->second->name;
    if (storage.nbytes() > record_bytes) {
      refusal = "the tensor at " + place + " claims a storage of " + std::to_string(storage.nbytes()) + " bytes, and its " +
                record_name + " holds " + std::to_string(record_bytes) + " (a forged or damaged file)";
      return;
    }
    const int64_t extent = view_extent(tensor.storage_offset(), tensor.sizes().data(), tensor.strides().data(),
                                       tensor.sizes().size());
    const int64_t elements = static_cast<int64_t>(storage.nbytes() / tensor.element_size());
    if (extent < 0 || extent > elements) {
      refusal = "the tensor at " + place + " (" + view_text(tensor) + ") reaches past its storage of " +
                std::to_string(elements) + " elements (a forged or damaged file)";
    }
  };
  if (auto shape = walk_unpickled(value, visit); shape && !refusal) refusal = std::move(shape);
  if (refusal) {
    dismantle(std::move(value));
    fail_checkpoint(path, *refusal);
  }
}

}  // namespace loom::detail
