// flat_storage.hpp.
#include "flat_storage.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/CPUAllocator.h>

#include <vector>

namespace loom::detail {

void free_storage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == 0) return;
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

void allocate_storage(const at::Tensor& tensor, std::size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == nbytes) return;
  at::Allocator* allocator = storage->allocator();
  if (allocator == nullptr) allocator = c10::GetAllocator(tensor.device().type());
  storage->set_data_ptr_noswap(allocator->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

std::size_t bytes_of(const at::Tensor& flat) { return static_cast<std::size_t>(flat.numel()) * flat.element_size(); }

at::Tensor alias(const at::Tensor& base, int64_t offset, at::IntArrayRef shape) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  at::Tensor out = at::empty({0}, base.options());
  out.set_(base.storage(), base.storage_offset() + offset, shape, strides);
  return out;
}

}  // namespace loom::detail
