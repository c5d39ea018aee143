// Chunked tensor-parallel parameters gathered to full size and back
// (include/loom/tp/full_parameters.hpp).
#include <loom/tp/full_parameters.hpp>
#include <loom/tp/parallelize.hpp>

#include "../util/optimizer_families.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <unordered_map>

namespace loom::tp {

std::vector<named_chunk> sharded_parameters_of(const torch::nn::Module& module) {
  std::unordered_map<const void*, int64_t> dim_of;
  for (const layer_marker* layer : parallelized_layers(module)) {
    for (const auto& chunk : layer->sharded_parameters()) dim_of[chunk.value.unsafeGetTensorImpl()] = chunk.dim;
  }
  std::vector<named_chunk> out;
  for (const auto& item : module.named_parameters()) {
    auto found = dim_of.find(item.value().unsafeGetTensorImpl());
    if (found != dim_of.end()) out.push_back({item.key(), item.value(), found->second});
  }
  return out;
}

void with_full_parameters(const std::vector<const torch::nn::Module*>& modules, const comm::process_group& tp_group,
                          const std::vector<torch::optim::Optimizer*>& optimizers, const std::function<void()>& body,
                          bool write_back) {
  at::NoGradGuard no_grad;
  comm::process_group group = tp_group;
  const int size = group.size(), rank = group.rank();
  auto gather = [&](const at::Tensor& chunk, int64_t dim) {
    return at::cat(group.all_gather_stacked(chunk.contiguous()).unbind(0), dim);
  };
  auto chunk_of = [&](const at::Tensor& full, int64_t dim) { return full.chunk(size, dim)[rank].clone(); };

  std::unordered_map<const void*, int64_t> dim_of;
  std::vector<std::pair<at::Tensor, int64_t>> parameters;
  for (const torch::nn::Module* module : modules) {
    for (auto& chunk : sharded_parameters_of(*module)) {
      if (dim_of.emplace(chunk.parameter.unsafeGetTensorImpl(), chunk.dim).second) {
        parameters.emplace_back(chunk.parameter, chunk.dim);
      }
    }
  }
  // The optimizers' state of chunked parameters, gathered (in param_groups
  // order: the same on every rank) while the parameters are still chunks.
  struct state_slot {
    at::Tensor* value;
    at::Tensor chunk;  // as the optimizer held it
    std::vector<int64_t> shape;  // its parameter's (the state may be flat)
    int64_t dim;
  };
  std::vector<state_slot> states;
  for (torch::optim::Optimizer* optimizer : optimizers) {
    loom::detail::for_each_state_tensor(*optimizer, [&](const at::Tensor& parameter, std::string_view, at::Tensor& value) {
      auto found = dim_of.find(parameter.unsafeGetTensorImpl());
      if (found == dim_of.end() || !value.defined() || value.dim() == 0 || value.numel() != parameter.numel()) return;
      states.push_back({&value, value, parameter.sizes().vec(), found->second});
    });
  }
  std::vector<at::Tensor> full_states;
  for (auto& slot : states) full_states.push_back(gather(slot.chunk.reshape(slot.shape), slot.dim));
  std::vector<at::Tensor> chunks;
  for (auto& [parameter, dim] : parameters) {
    chunks.push_back(parameter.detach());
    at::Tensor full = gather(parameter.detach(), dim);
    parameter.set_data(full);
  }
  for (std::size_t i = 0; i < states.size(); ++i) *states[i].value = full_states[i];

  auto restore = [&](bool keep) {
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      auto& [parameter, dim] = parameters[i];
      parameter.set_data(keep ? chunk_of(parameter.detach(), dim) : chunks[i]);
    }
    if (!keep) {
      for (auto& slot : states) *slot.value = slot.chunk;
      return;
    }
    // body may have replaced the optimizers' state (a load does): every
    // full-sized field of a chunked parameter keeps this rank's chunk.
    for (torch::optim::Optimizer* optimizer : optimizers) {
      loom::detail::for_each_state_tensor(*optimizer, [&](const at::Tensor& parameter, std::string_view, at::Tensor& value) {
        auto found = dim_of.find(parameter.unsafeGetTensorImpl());
        if (found == dim_of.end() || !value.defined() || value.dim() == 0) return;
        if (value.numel() != parameter.numel() * size) return;
        std::vector<int64_t> full_shape = parameter.sizes().vec();
        full_shape[static_cast<std::size_t>(found->second)] *= size;
        value = chunk_of(value.reshape(full_shape), found->second);
      });
    }
  };
  try {
    body();
  } catch (...) {
    restore(false);
    throw;
  }
  restore(write_back);
}

}  // namespace loom::tp
