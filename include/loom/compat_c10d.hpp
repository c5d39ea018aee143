// The c10d half of loom/compat.hpp: LibTorch 1.13 vs 2.x differences in the
// distributed API. Separate only because c10d's headers (and Gloo's) are
// heavy; only loom's compiled sources include it.
#pragma once

#include <loom/compat.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>
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

#if LOOM_TORCH_VERSION_AT_LEAST(2, 0)
namespace detail {
// 2.0-2.5 construct a ProcessGroup from (store, rank, size, Options{backend
// name}); later 2.x dropped Options. Chosen by what the type offers, so every
// 2.x compiles without a version table.
template <class Group>
c10::intrusive_ptr<Group> make_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             const char* backend_name) {
  if constexpr (requires { typename Group::Options; }) {
    return c10::make_intrusive<Group>(store, rank, size, c10::make_intrusive<typename Group::Options>(backend_name));
  } else {
    return c10::make_intrusive<Group>(store, rank, size);
  }
}
}  // namespace detail
#endif

// The ProcessGroup that engines such as c10d::Reducer take.
inline c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                               int size, const c10::intrusive_ptr<c10d_backend>& backend,
                                                               bool is_cuda) {
#if LOOM_TORCH_VERSION_AT_LEAST(2, 0)
  auto group = detail::make_process_group<c10d::ProcessGroup>(store, rank, size, is_cuda ? "nccl" : "gloo");
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

// c10d::Reducer's constructor across versions, told apart by what the type
// accepts (a template, so this header needs no reducer.hpp; callers name
// c10d::Reducer). `bucket_limits` is [first bucket bytes, bucket bytes]:
//  - 1.13 takes it as per_bucket_size_limits, the 3rd argument;
//  - early 2.x drops it (the limits come from the two caps);
//  - later 2.x add skip_all_reduce_unused_params and use_python_reducer (off:
//    DDP's defaults), then bucket_bytes_cap_list, passed empty as Python's DDP
//    does unless the user gives per-bucket caps.
template <class Reducer>
std::shared_ptr<Reducer> make_reducer(std::vector<at::Tensor> params, std::vector<std::vector<std::size_t>> bucket_indices,
                                      std::vector<std::size_t> bucket_limits,
                                      c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<bool> sparse,
                                      std::int64_t bucket_bytes, bool find_unused, bool gradient_as_bucket_view,
                                      std::unordered_map<std::size_t, std::string> names, std::int64_t first_bucket_bytes) {
  using params_t = std::vector<at::Tensor>;
  using indices_t = std::vector<std::vector<std::size_t>>;
  using group_t = c10::intrusive_ptr<c10d::ProcessGroup>;
  using names_t = std::unordered_map<std::size_t, std::string>;
  if constexpr (std::is_constructible_v<Reducer, params_t, indices_t, std::vector<std::size_t>, group_t,
                                        std::vector<bool>, std::int64_t, bool, bool, names_t, std::int64_t>) {
    return std::make_shared<Reducer>(std::move(params), std::move(bucket_indices), std::move(bucket_limits),
                                     std::move(group), std::move(sparse), bucket_bytes, find_unused,
                                     gradient_as_bucket_view, std::move(names), first_bucket_bytes);
  } else if constexpr (std::is_constructible_v<Reducer, params_t, indices_t, group_t, std::vector<bool>, std::int64_t,
                                               bool, bool, names_t, std::int64_t, bool, bool,
                                               std::vector<std::int64_t>>) {
    return std::make_shared<Reducer>(std::move(params), std::move(bucket_indices), std::move(group), std::move(sparse),
                                     bucket_bytes, find_unused, gradient_as_bucket_view, std::move(names),
                                     first_bucket_bytes, /*skip_all_reduce_unused_params=*/false,
                                     /*use_python_reducer=*/false, std::vector<std::int64_t>{});
  } else if constexpr (std::is_constructible_v<Reducer, params_t, indices_t, group_t, std::vector<bool>, std::int64_t,
                                               bool, bool, names_t, std::int64_t, bool, bool>) {
    return std::make_shared<Reducer>(std::move(params), std::move(bucket_indices), std::move(group), std::move(sparse),
                                     bucket_bytes, find_unused, gradient_as_bucket_view, std::move(names),
                                     first_bucket_bytes, /*skip_all_reduce_unused_params=*/false,
                                     /*use_python_reducer=*/false);
  } else {
    return std::make_shared<Reducer>(std::move(params), std::move(bucket_indices), std::move(group), std::move(sparse),
                                     bucket_bytes, find_unused, gradient_as_bucket_view, std::move(names),
                                     first_bucket_bytes);
  }
}

}  // namespace loom::compat
