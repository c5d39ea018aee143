// The c10d half of loom/compat.hpp: LibTorch 1.13 vs 2.x differences in the
// distributed API. Separate only because c10d's headers (and Gloo's) are
// heavy; only loom's compiled sources include it.
#pragma once

#include <loom/compat.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#if defined(LOOM_WITH_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace loom::compat {

// What runs the collectives: in 1.13 ProcessGroupGloo is a ProcessGroup; from
// 2.0 it is a Backend that a ProcessGroup dispatches to.
#if LOOM_TORCH_VERSION_AT_LEAST(2, 0)
using c10d_backend = c10d::Backend;
#else
using c10d_backend = c10d::ProcessGroup;
#endif

// The ProcessGroup that engines such as c10d::Reducer take.
inline c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                               int size, const c10::intrusive_ptr<c10d_backend>& backend,
                                                               bool is_cuda) {
#if LOOM_TORCH_VERSION_AT_LEAST(2, 0)
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size,
                                                       c10::make_intrusive<c10d::ProcessGroup::Options>(
                                                           is_cuda ? "nccl" : "gloo"));
  const auto device = is_cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  const auto type = is_cuda ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
  group->setBackend(device, type, backend);
  group->setDefaultBackend(type);
  return group;
#else
  (void)store;
  (void)rank;
  (void)size;
  (void)is_cuda;
  return backend;
#endif
}

}  // namespace loom::compat
