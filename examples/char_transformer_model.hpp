// The char transformer's model (examples/char_transformer.cpp trains it on
// text; examples/char_transformer_bench.cpp gives it to loom-bench): token
// and position embeddings, pre-norm blocks of causal multi-head attention
// and a GELU MLP, a final norm and a head over the 256 byte values; and its
// tensor-parallel plan.
#pragma once

#include <loom/comm/device_mesh.hpp>
#include <loom/tp/layers.hpp>
#include <loom/tp/parallelize.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace char_transformer {

constexpr int64_t vocabulary = 256;  // bytes

struct shape {
  int64_t context = 128;
  int64_t dim = 128;
  int64_t heads = 4;
  int64_t layers = 3;
};

// A pre-norm block: causal multi-head attention, then a GELU MLP. Its
// projections are loom::tp layers (torch::nn::Linear until a plan gives them
// a style); parallelize_fn divides local_heads by the tensor-parallel size.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t heads)
      : dim(dim), heads(heads), local_heads(heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        attn_in(register_module("attn_in", loom::tp::Prepare())),
        mlp_in(register_module("mlp_in", loom::tp::Prepare())),
        wq(register_module("wq", loom::tp::Linear(dim, dim))),
        wk(register_module("wk", loom::tp::Linear(dim, dim))),
        wv(register_module("wv", loom::tp::Linear(dim, dim))),
        wo(register_module("wo", loom::tp::Linear(dim, dim))),
        w1(register_module("w1", loom::tp::Linear(dim, 4 * dim))),
        w2(register_module("w2", loom::tp::Linear(4 * dim, dim))) {}

  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = attn_in(ln1(x));
    const int64_t b = h.size(0), t = h.size(1), hd = dim / heads;
    auto split = [&](const at::Tensor& y) { return y.view({b, t, local_heads, hd}).transpose(1, 2); };
    const at::Tensor q = split(wq(h)), k = split(wk(h)), v = split(wv(h));
    const at::Tensor future = at::ones({t, t}, at::kBool).triu(1);
    const at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).div(std::sqrt(static_cast<double>(hd)));
    const at::Tensor attention = at::matmul(at::softmax(scores.masked_fill(future, -1e9), -1), v)
                                     .transpose(1, 2)
                                     .reshape({b, t, local_heads * hd});
    const at::Tensor mid = x + wo(attention);
    return mid + w2(torch::gelu(w1(mlp_in(ln2(mid)))));
  }

  int64_t dim, heads, local_heads;
  torch::nn::LayerNorm ln1, ln2;
  loom::tp::Prepare attn_in, mlp_in;
  loom::tp::Linear wq, wk, wv, wo, w1, w2;
};
TORCH_MODULE(Block);

struct CharTransformerImpl : torch::nn::Module {
  explicit CharTransformerImpl(const shape& opts)
      : tok(register_module("tok", loom::tp::Embedding(vocabulary, opts.dim))),
        pos(register_module("pos", torch::nn::Embedding(opts.context, opts.dim))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({opts.dim})))),
        head(register_module("head", loom::tp::Linear(opts.dim, vocabulary))) {
    for (int64_t i = 0; i < opts.layers; ++i) blocks->push_back(Block(opts.dim, opts.heads));
    // GPT-2's initialisation (small weights; residual projections scaled by
    // depth), drawn in full before any plan: every configuration starts from
    // the same weights.
    torch::NoGradGuard no_grad;
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      at::Tensor p = item.value();
      if (name.find("ln") != std::string::npos) continue;
      if (name.size() > 5 && name.substr(name.size() - 5) == ".bias") {
        p.zero_();
      } else {
        const bool residual = name.find(".wo.") != std::string::npos || name.find(".w2.") != std::string::npos;
        p.normal_(0.0, residual ? 0.02 / std::sqrt(2.0 * static_cast<double>(opts.layers)) : 0.02);
      }
    }
  }

  at::Tensor forward(const at::Tensor& ids) {
    at::Tensor x = tok(ids) + pos(at::arange(ids.size(1), at::kLong));
    for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x);
    return head(ln_f(x));
  }

  loom::tp::Embedding tok;
  torch::nn::Embedding pos;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
  loom::tp::Linear head;
};
TORCH_MODULE(CharTransformer);

// The tensor-parallel plan (the documented example of one, docs/model-parallel.md).
inline void parallelize(torch::nn::Module& module, loom::comm::device_mesh& mesh) {
  using namespace loom::tp;
  const colwise_parallel after_prepare{.input_prepared = true};
  parallelize_module(module, mesh,
                     {{"tok", rowwise_parallel{}},  // vocabulary-parallel; outputs all-reduced
                      {"blocks.*.attn_in", prepare_module_input{}},
                      {"blocks.*.wq", after_prepare},
                      {"blocks.*.wk", after_prepare},
                      {"blocks.*.wv", after_prepare},
                      {"blocks.*.wo", rowwise_parallel{}},
                      {"blocks.*.mlp_in", prepare_module_input{}},
                      {"blocks.*.w1", after_prepare},
                      {"blocks.*.w2", rowwise_parallel{}},
                      {"head", colwise_parallel{.output_layout = replicate()}}});
  // Attention reads its local head count: each rank runs heads / tp of them.
  auto& model = dynamic_cast<CharTransformerImpl&>(module);
  for (const auto& block : *model.blocks) block->as<BlockImpl>()->local_heads /= mesh.size("tensor_parallel");
}

}  // namespace char_transformer
