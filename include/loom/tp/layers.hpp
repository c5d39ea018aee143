// The layers a tensor-parallel plan configures: loom::tp::Linear and
// loom::tp::Embedding are torch::nn::Linear and torch::nn::Embedding (they
// derive from them: same constructors, options, parameter names and
// initialisation, same forward) until parallelize_module gives them a style.
// LibTorch 1.13 has no forward hooks, so, as with loom::unit, the layer's own
// forward is where the style's collectives run. Parallelizing keeps this
// rank's slice of the full initialisation: a tensor-parallel model starts
// from the same full weights as the single-device one built with the same seed.
#pragma once

#include <loom/comm/process_group.hpp>
#include <loom/tp/style.hpp>

#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

namespace loom::tp {

namespace detail {
// A layer's style and group once parallelized (src/tp/layers.cpp).
struct binding;
at::Tensor linear_forward(const binding& bound, const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& bias);
at::Tensor embedding_forward(const binding& bound, const at::Tensor& input, const at::Tensor& weight);
at::Tensor prepare_forward(const binding& bound, const at::Tensor& input);
at::Tensor layer_norm_forward(const binding& bound, const at::Tensor& input, const at::Tensor& weight,
                              const at::Tensor& bias, const torch::nn::LayerNormOptions& options);
at::Tensor dropout_forward(const binding& bound, const at::Tensor& input, double p, bool training);
}  // namespace detail

// A parameter that holds this rank's chunk of the full tensor along dim
// (chunk(group size, dim)[group rank]): its placement, as the layer
// publishes it.
struct sharded_parameter {
  at::Tensor value;
  int64_t dim = 0;
  comm::process_group group;
};

// What parallelize_module finds among a model's modules (dynamic_cast, once).
class layer_marker {
 public:
  virtual ~layer_marker() = default;
  // Shards the parameters for `style` on `group` and makes forward run its
  // collectives. `name` is the submodule's, for messages. Once per layer.
  virtual void parallelize(const std::string& name, const parallel_style& style, const comm::process_group& group) = 0;
  bool parallelized() const noexcept { return binding_ != nullptr; }
  // This layer's parameters that hold a shard (1/group size of the full
  // tensor); the others are replicated across the group.
  const std::vector<sharded_parameter>& sharded_parameters() const noexcept { return sharded_; }

 protected:
  std::shared_ptr<const detail::binding> binding_;
  std::vector<sharded_parameter> sharded_;
};

class LinearImpl : public torch::nn::LinearImpl, public layer_marker {
 public:
  using torch::nn::LinearImpl::LinearImpl;
  at::Tensor forward(const at::Tensor& input) {
    if (!binding_) return torch::nn::LinearImpl::forward(input);
    return detail::linear_forward(*binding_, input, weight, bias);
  }
  void parallelize(const std::string& name, const parallel_style& style, const comm::process_group& group) override;
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public torch::nn::EmbeddingImpl, public layer_marker {
 public:
  using torch::nn::EmbeddingImpl::EmbeddingImpl;
  at::Tensor forward(const at::Tensor& input) {
    if (!binding_) return torch::nn::EmbeddingImpl::forward(input);
    return detail::embedding_forward(*binding_, input, weight);
  }
  void parallelize(const std::string& name, const parallel_style& style, const comm::process_group& group) override;
};
TORCH_MODULE(Embedding);

// torch::nn::LayerNorm until a plan gives it sequence_parallel.
class LayerNormImpl : public torch::nn::LayerNormImpl, public layer_marker {
 public:
  using torch::nn::LayerNormImpl::LayerNormImpl;
  at::Tensor forward(const at::Tensor& input) {
    if (!binding_) return torch::nn::LayerNormImpl::forward(input);
    return detail::layer_norm_forward(*binding_, input, weight, bias, options);
  }
  void parallelize(const std::string& name, const parallel_style& style, const comm::process_group& group) override;
};
TORCH_MODULE(LayerNorm);

// torch::nn::Dropout until a plan gives it sequence_parallel (a mask per rank).
class DropoutImpl : public torch::nn::DropoutImpl, public layer_marker {
 public:
  using torch::nn::DropoutImpl::DropoutImpl;
  at::Tensor forward(const at::Tensor& input) {
    if (!binding_) return torch::nn::DropoutImpl::forward(input);
    return detail::dropout_forward(*binding_, input, options.p(), is_training());
  }
  void parallelize(const std::string& name, const parallel_style& style, const comm::process_group& group) override;
};
TORCH_MODULE(Dropout);

// The identity, until a plan gives it prepare_module_input: a block calls it
// on its input (LibTorch has no forward pre-hooks to do it for the block).
class PrepareImpl : public torch::nn::Cloneable<PrepareImpl>, public layer_marker {
 public:
  void reset() override {}
  at::Tensor forward(const at::Tensor& input) {
    if (!binding_) return input;
    return detail::prepare_forward(*binding_, input);
  }
  void parallelize(const std::string& name, const parallel_style& style, const comm::process_group& group) override;
};
TORCH_MODULE(Prepare);

}  // namespace loom::tp
