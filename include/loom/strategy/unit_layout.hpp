// The units a sharded strategy makes of a module as declared: the root and
// every loom::unit<M> below it, in module order, each with its own
// parameters (a nested unit's are its own; each parameter once, in the first
// unit that registers it). It is what fsdp's engine flattens per unit when no
// wrap policy adds units and no weight is tied across units (the engine then
// moves it to a common ancestor), and what sharded construction cuts a unit
// by (unit_construction.hpp). loom-bench's formulas read a model's sizes here.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace torch::nn {
class Module;
}

namespace loom {

// [0]: the root's own parameters; then one entry per unit, in module order.
std::vector<std::vector<at::Tensor>> unit_parameters(torch::nn::Module& root);

}  // namespace loom
