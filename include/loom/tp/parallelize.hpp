// PyTorch's parallelize_module(module, mesh, plan): each plan entry names a
// submodule (a '*' matches one path segment) and the style it gets. The named
// submodules must be loom::tp layers: a plain torch::nn::Linear cannot run a
// style's collectives (no forward hooks in LibTorch 1.13), and naming one is
// an error that says which holder to declare instead. Collective over the
// group only in that every rank must apply the same plan.
#pragma once

#include <loom/comm/device_mesh.hpp>
#include <loom/comm/process_group.hpp>
#include <loom/tp/layers.hpp>
#include <loom/tp/style.hpp>

#include <torch/nn/module.h>

namespace loom::tp {

// On the group of tensor-parallel ranks.
void parallelize_module(torch::nn::Module& module, const comm::process_group& group, const parallelize_plan& plan);

// On a mesh's "tensor_parallel" dimension (the mesh model_parallel gives parallelize_fn).
void parallelize_module(torch::nn::Module& module, comm::device_mesh& mesh, const parallelize_plan& plan);

// Every tensor-parallel layer of module that a plan parallelized.
std::vector<const layer_marker*> parallelized_layers(const torch::nn::Module& module);

}  // namespace loom::tp
