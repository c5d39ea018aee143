// What the sharding engine does to its flat buffers' storages: a storage
// emptied (its bytes back to the allocator) and refilled in place, so every
// view of it stays a view of it; and a view over a storage with a version
// counter of its own (fsdp_engine.cpp says why both matter to autograd).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>

namespace loom::detail {

void free_storage(const at::Tensor& tensor);
// Gives tensor's storage nbytes (from its allocator) unless it has them.
void allocate_storage(const at::Tensor& tensor, std::size_t nbytes);
std::size_t bytes_of(const at::Tensor& flat);
// A tensor of `shape` (contiguous) over base's storage from `offset`.
at::Tensor alias(const at::Tensor& base, int64_t offset, at::IntArrayRef shape);

}  // namespace loom::detail
