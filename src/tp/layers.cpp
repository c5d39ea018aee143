// The tensor-parallel layers' setup (slicing the full initialisation) and
// forwards: each style's collectives through comm/autograd.hpp, whose
// backwards are the transposed collectives.
#include <loom/comm/autograd.hpp>
#include <loom/errors.hpp>
#include <loom/tp/layers.hpp>
#include <loom/util/placeholder.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/embedding.h>

namespace loom::tp {

std::string describe(const parallel_style& style) {
  auto text = [](const layout& l) {
    return l.kind == layout::placement::replicate ? std::string("replicate()") : "shard(" + std::to_string(l.dim) + ")";
  };
  return std::visit(
      [&](const auto& s) {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, prepare_module_input>) {
          return "prepare_module_input(" + text(s.input_layout) + " to " + text(s.desired_input_layout) + ")";
        } else if constexpr (std::is_same_v<S, sequence_parallel>) {
          return "sequence_parallel(sequence dim " + std::to_string(s.sequence_dim) + ")";
        } else {
          const std::string name = std::is_same_v<S, colwise_parallel> ? "colwise_parallel" : "rowwise_parallel";
          return name + "(input " + text(s.input_layout) + ", output " + text(s.output_layout) + ")";
        }
      },
      style);
}

namespace detail {

struct binding {
  comm::process_group group;
  parallel_style style;
  // Dropout under sequence_parallel: this rank's own mask generator.
  mutable at::Generator generator;
};

namespace {

// This rank's slice along dim of the full (identically initialised) tensor.
// A unit's parameter built under init_module(true) is a placeholder until
// setup gathers its unit: it stays one, of the slice's shape, and setup
// gives it the slice (loom::detail::note_tensor_parallel_chunks).
void keep_slice(torch::Tensor& parameter, int64_t dim, const comm::process_group& group) {
  torch::NoGradGuard no_grad;
  const at::Tensor slice = parameter.chunk(group.size(), dim)[group.rank()];
  parameter.set_data(loom::detail::is_placeholder(parameter) ? slice : slice.clone());
}

void check_divisible(const std::string& name, const char* what, int64_t extent, const comm::process_group& group,
                     const parallel_style& style) {
  if (extent % group.size() != 0) {
    throw configuration_error("parallelize_module: '" + name + "' gets " + describe(style) + ", which splits its " +
                              what + " (" + std::to_string(extent) + ") over " + std::to_string(group.size()) +
                              " tensor-parallel ranks; it must be a multiple of " + std::to_string(group.size()));
  }
}

void check_layouts(const std::string& name, const parallel_style& style, bool embedding) {
  if (std::holds_alternative<prepare_module_input>(style) || std::holds_alternative<sequence_parallel>(style)) {
    throw configuration_error("parallelize_module: '" + name + "' is a " + (embedding ? "Embedding" : "Linear") +
                              "; it takes colwise_parallel or rowwise_parallel, not " + describe(style));
  }
  std::visit(
      [&](const auto& s) {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, prepare_module_input> || std::is_same_v<S, sequence_parallel>) {
        } else if constexpr (std::is_same_v<S, colwise_parallel>) {
          if (s.output_layout != replicate() && s.output_layout != shard(-1)) {
            throw configuration_error("parallelize_module: '" + name + "': colwise_parallel's output is sharded on "
                                      "the last dimension (shard(-1)) or gathered (replicate()); got " +
                                      describe(style));
          }
          if (embedding && s.input_layout != replicate()) {
            throw configuration_error("parallelize_module: '" + name + "': an Embedding's input (token ids) is "
                                      "replicated; got " + describe(style));
          }
        } else {
          if (s.input_layout != replicate() && s.input_layout != shard(-1)) {
            throw configuration_error("parallelize_module: '" + name + "': rowwise_parallel's input is sharded on "
                                      "the last dimension (shard(-1)) or replicated (this rank's chunk is taken); "
                                      "got " + describe(style));
          }
          if (embedding && s.input_layout != shard(-1) && s.input_layout != replicate()) {
            throw configuration_error("parallelize_module: '" + name + "': an Embedding's ids are replicated");
          }
        }
      },
      style);
}

// Replicate → rows of the reduction, or a sequence shard of it.
at::Tensor reduce_partial(const binding& bound, const at::Tensor& partial, const layout& output) {
  if (output.kind == layout::placement::replicate) return comm::all_reduce_with_grad(bound.group, partial);
  return comm::reduce_scatter_with_grad(bound.group, partial, output.dim);
}

}  // namespace

at::Tensor linear_forward(const binding& bound, const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& bias) {
  if (const auto* col = std::get_if<colwise_parallel>(&bound.style)) {
    // Replicated input: identity forward, all-reduce of its gradient; a
    // sequence-sharded input is all-gathered (its gradient reduce-scattered).
    const at::Tensor x = col->input_prepared ? input
                         : col->input_layout.kind == layout::placement::replicate
                             ? comm::copy_to_group(bound.group, input)
                             : comm::all_gather_with_grad(bound.group, input, col->input_layout.dim);
    const at::Tensor y = at::linear(x, weight, bias);
    if (col->output_layout.kind == layout::placement::shard) return y;
    return comm::all_gather_with_grad(bound.group, y, -1, comm::gathered_gradient::replicated);
  }
  const auto& row = std::get<rowwise_parallel>(bound.style);
  const at::Tensor x = row.input_layout.kind == layout::placement::replicate
                           ? comm::scatter_to_group(bound.group, input, -1)
                           : input;
  at::Tensor y = reduce_partial(bound, at::linear(x, weight), row.output_layout);
  // The bias is replicated: added once, after the reduction. On a
  // sequence-sharded output each rank's bias gradient is partial: summed over
  // the group (Megatron's rule).
  if (bias.defined()) {
    y = y + (row.output_layout.kind == layout::placement::shard ? comm::copy_to_group(bound.group, bias) : bias);
  }
  return y;
}

at::Tensor embedding_forward(const binding& bound, const at::Tensor& input, const at::Tensor& weight) {
  if (const auto* col = std::get_if<colwise_parallel>(&bound.style)) {
    const at::Tensor y = at::embedding(weight, input);
    if (col->output_layout.kind == layout::placement::shard) return y;
    return comm::all_gather_with_grad(bound.group, y, -1, comm::gathered_gradient::replicated);
  }
  // Vocabulary-parallel: this rank holds ids [first, first + rows).
  const int64_t rows = weight.size(0);
  const int64_t first = rows * bound.group.rank();
  const at::Tensor outside = (input < first).logical_or(input >= first + rows);
  const at::Tensor local = (input - first).masked_fill(outside, 0);
  const at::Tensor partial = at::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_partial(bound, partial, std::get<rowwise_parallel>(bound.style).output_layout);
}

at::Tensor prepare_forward(const binding& bound, const at::Tensor& input) {
  const auto& prepare = std::get<prepare_module_input>(bound.style);
  const bool from_replicate = prepare.input_layout.kind == layout::placement::replicate;
  const bool to_replicate = prepare.desired_input_layout.kind == layout::placement::replicate;
  if (from_replicate && to_replicate) return comm::copy_to_group(bound.group, input);
  if (to_replicate) return comm::all_gather_with_grad(bound.group, input, prepare.input_layout.dim);
  if (from_replicate) return comm::scatter_to_group(bound.group, input, prepare.desired_input_layout.dim);
  if (prepare.input_layout == prepare.desired_input_layout) return input;
  throw configuration_error("a loom::tp::Prepare cannot move a tensor from one sharded dimension to another "
                            "(all-to-all) yet; " + describe(bound.style));
}

at::Tensor layer_norm_forward(const binding& bound, const at::Tensor& input, const at::Tensor& weight,
                              const at::Tensor& bias, const torch::nn::LayerNormOptions& options) {
  // copy_to_group: identity forward; the partial gradients all-reduced in backward.
  const at::Tensor w = weight.defined() ? comm::copy_to_group(bound.group, weight) : weight;
  const at::Tensor b = bias.defined() ? comm::copy_to_group(bound.group, bias) : bias;
  return at::layer_norm(input, options.normalized_shape(), w, b, options.eps());
}

at::Tensor dropout_forward(const binding& bound, const at::Tensor& input, double p, bool training) {
  if (!training || p == 0.0) return input;
  if (p == 1.0) return input * 0.0;
  const at::Tensor keep = at::empty_like(input).bernoulli_(1.0 - p, bound.generator);
  return input * keep / (1.0 - p);
}

namespace {
void bind_sequence_parallel(const std::string& name, const char* what, const parallel_style& style,
                            const comm::process_group& group, std::shared_ptr<const binding>& out) {
  if (out) throw configuration_error("parallelize_module: '" + name + "' is already parallelized");
  if (!std::holds_alternative<sequence_parallel>(style)) {
    throw configuration_error("parallelize_module: '" + name + "' is a " + what + ", which takes sequence_parallel; got " +
                              describe(style));
  }
  // Independent masks per rank and per layer, reproducible from the global
  // seed (read, not consumed: the model's other random draws stay those of
  // the single-device run): seed, layer (counted in plan order, the same on
  // every rank) and rank, mixed.
  static std::atomic<std::uint64_t> layers{0};
  const std::uint64_t layer = layers.fetch_add(1);
  const std::uint64_t seed = at::detail::getDefaultCPUGenerator().current_seed();
  const std::uint64_t mixed = seed * 0x9E3779B97F4A7C15ULL + (layer + 1) * 0xBF58476D1CE4E5B9ULL +
                              static_cast<std::uint64_t>(group.rank() + 1) * 0x94D049BB133111EBULL;
  out = std::make_shared<binding>(binding{group, style, at::detail::createCPUGenerator(mixed)});
}
}  // namespace

}  // namespace detail

void LayerNormImpl::parallelize(const std::string& name, const parallel_style& style,
                                const comm::process_group& group) {
  detail::bind_sequence_parallel(name, "LayerNorm", style, group, binding_);
}

void DropoutImpl::parallelize(const std::string& name, const parallel_style& style, const comm::process_group& group) {
  detail::bind_sequence_parallel(name, "Dropout", style, group, binding_);
}

void PrepareImpl::parallelize(const std::string& name, const parallel_style& style,
                              const comm::process_group& group) {
  if (binding_) throw configuration_error("parallelize_module: '" + name + "' is already parallelized");
  if (!std::holds_alternative<prepare_module_input>(style)) {
    throw configuration_error("parallelize_module: '" + name + "' is a loom::tp::Prepare, which takes "
                              "prepare_module_input; got " + describe(style));
  }
  binding_ = std::make_shared<const detail::binding>(detail::binding{group, style});
}

void LinearImpl::parallelize(const std::string& name, const parallel_style& style, const comm::process_group& group) {
  if (binding_) throw configuration_error("parallelize_module: '" + name + "' is already parallelized");
  detail::check_layouts(name, style, /*embedding=*/false);
  const bool colwise = std::holds_alternative<colwise_parallel>(style);
  if (colwise) {
    detail::check_divisible(name, "out_features", weight.size(0), group, style);
    detail::keep_slice(weight, 0, group);
    sharded_.push_back({weight, 0, group});
    if (bias.defined()) {
      detail::keep_slice(bias, 0, group);
      sharded_.push_back({bias, 0, group});
    }
  } else {
    detail::check_divisible(name, "in_features", weight.size(1), group, style);
    detail::keep_slice(weight, 1, group);
    sharded_.push_back({weight, 1, group});
  }
  binding_ = std::make_shared<const detail::binding>(detail::binding{group, style});
}

void EmbeddingImpl::parallelize(const std::string& name, const parallel_style& style,
                                const comm::process_group& group) {
  if (binding_) throw configuration_error("parallelize_module: '" + name + "' is already parallelized");
  if (options.padding_idx() || options.max_norm()) {
    throw configuration_error("parallelize_module: '" + name + "' is an Embedding with padding_idx or max_norm, "
                              "which tensor parallel does not support; build it without them");
  }
  detail::check_layouts(name, style, /*embedding=*/true);
  const bool colwise = std::holds_alternative<colwise_parallel>(style);
  const int64_t dim = colwise ? 1 : 0;
  detail::check_divisible(name, colwise ? "embedding_dim" : "num_embeddings (the vocabulary)", weight.size(dim), group,
                          style);
  detail::keep_slice(weight, dim, group);
  sharded_.push_back({weight, dim, group});
  binding_ = std::make_shared<const detail::binding>(detail::binding{group, style});
}

}  // namespace loom::tp
