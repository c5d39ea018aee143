// DataParallel's mechanics (Lightning's "dp", torch.nn.DataParallel): one
// process drives several devices. Each forward scatters the tensor arguments
// along dimension 0 (one chunk per device), runs the module's replicas in
// threads (the first on the root module, in the calling thread), and gathers
// the outputs on the root device.
//
// Replicas are clones kept between steps; each forward refreshes their
// parameters and buffers from the root's (a broadcast) and points every
// replica parameter's gradient edge, through one node per parameter, at the
// root parameter's gradient accumulator: autograd itself sums the replicas'
// gradients into the root module. LibTorch's replicate() does the same with a
// CUDA-only ReduceAdd (and its header does not compile without CUDA); this
// node is ordinary ops, so the mechanics also run with every replica on the
// CPU, which is how they are tested on a machine without GPUs.
#pragma once

#include <loom/util/apply_to_collection.hpp>
#include <loom/util/module_fwd.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::detail {

class replica_set {
 public:
  // devices[0] is the root's (the module is already there).
  replica_set(torch::nn::Module& root, std::vector<c10::Device> devices);
  // The first `count` replicas made current: parameters, buffers and the
  // training flag copied from the root, gradient edges pointed at its
  // parameters (a new node per parameter and forward).
  void refresh(std::size_t count);
  // 0 is the root module itself.
  torch::nn::Module& replica(std::size_t index);
  const std::vector<c10::Device>& devices() const noexcept { return devices_; }

 private:
  torch::nn::Module* root_;
  std::vector<c10::Device> devices_;
  std::vector<std::shared_ptr<torch::nn::Module>> clones_;  // devices 1..n-1, made on first use
};

// Runs work(i) for i in [0, count): 0 on the calling thread, the others on
// threads of their own, each with the caller's grad mode. Rethrows the first
// exception once every thread has ended.
void run_replicas(std::size_t count, const std::function<void(std::size_t)>& work);

// The replicas' parts of one output on the root device: concatenated along
// dimension 0, or stacked when they have no dimension (a loss computed inside
// forward: one value per replica, as torch.nn.DataParallel gathers it).
at::Tensor gather_on_root(const std::vector<at::Tensor>& parts, c10::Device root);

// This replica's chunk of every tensor in an argument (along dimension 0, on
// its device); anything else is passed as it is.
template <class Arg>
auto scatter_argument(const Arg& argument, std::size_t index, std::size_t count, c10::Device device) {
  return apply_to_collection(argument, [&](const at::Tensor& tensor) {
    if (tensor.dim() == 0) return tensor.to(device);
    const auto chunks = tensor.chunk(static_cast<int64_t>(count), 0);
    return chunks[std::min(index, chunks.size() - 1)].to(device);
  });
}

// How many replicas a call can use: one per device, at most one per row of
// the first batched tensor argument.
template <class... Args>
std::size_t replicas_for(std::size_t devices, const Args&... arguments) {
  std::optional<int64_t> rows;
  auto first_rows = [&rows](const at::Tensor& tensor) {
    if (!rows && tensor.dim() > 0) rows = tensor.size(0);
  };
  (for_each_tensor(arguments, first_rows), ...);
  if (!rows) return 1;
  return std::max<std::size_t>(1, std::min<std::size_t>(devices, static_cast<std::size_t>(*rows)));
}

// One data-parallel forward: body(replica, scattered arguments...) on each
// replica, outputs gathered. Impl must be Cloneable (replicas are clones).
template <class Impl, class Body, class... Args>
auto data_parallel_forward(replica_set& replicas, Impl& root, Body&& body, const Args&... arguments) {
  // Cloneable<Impl> is what overrides Module::clone (which throws): asked as
  // "is clone overridden" so that this header needs no <torch/nn/cloneable.h>
  // (it brings torch/utils.h and the autograd profiler: 1.6 of the 10 s that
  // <loom/loom.hpp> alone took with it). The user's module includes it to
  // derive from it. Module is named through Impl: declared only here, it is
  // complete once Impl is.
  using module_base = std::conditional_t<true, torch::nn::Module, Impl>;
  static_assert(!std::is_same_v<decltype(&Impl::clone), decltype(&module_base::clone)>,
                "loom::dp replicates the module on each device, so it must be cloneable: derive NetImpl from "
                "torch::nn::Cloneable<NetImpl> (not torch::nn::Module) and implement reset(), registering the "
                "parameters and submodules there (as torch::nn::Linear does); the constructor then calls reset()");
  const std::size_t count = replicas_for(replicas.devices().size(), arguments...);
  replicas.refresh(count);
  using output_type = std::remove_cvref_t<decltype(body(root, scatter_argument(arguments, 0, 1, c10::Device(c10::kCPU))...))>;
  std::vector<std::optional<output_type>> outputs(count);
  run_replicas(count, [&](std::size_t i) {
    Impl& module = i == 0 ? root : dynamic_cast<Impl&>(replicas.replica(i));  // Module is a virtual base
    const c10::Device device = replicas.devices()[i];
    outputs[i].emplace(body(module, scatter_argument(arguments, i, count, device)...));
  });
  if (count == 1) return std::move(*outputs[0]);
  std::vector<std::vector<at::Tensor>> parts(count);
  for (std::size_t i = 0; i < count; ++i) {
    for_each_tensor(*outputs[i], [&parts, i](const at::Tensor& tensor) { parts[i].push_back(tensor); });
  }
  // for_each_tensor visits in a fixed order (apply_to_collection's tuple
  // case may not): the root's output, in place, takes each gathered tensor.
  std::size_t position = 0;
  const c10::Device root_device = replicas.devices().front();
  output_type gathered = std::move(*outputs[0]);
  for_each_tensor(gathered, [&](at::Tensor& tensor) {
    std::vector<at::Tensor> same_output;
    for (std::size_t i = 0; i < count; ++i) same_output.push_back(parts[i].at(position));
    ++position;
    tensor = gather_on_root(same_output, root_device);
  });
  return gathered;
}

}  // namespace loom::detail
