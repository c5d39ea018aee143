// A pre-norm transformer block (causal multi-head attention, then a GELU
// MLP) whose projections are LayerT (loom::tp::Linear to be parallelized,
// torch::nn::Linear as the single-device reference), and its tensor-parallel
// plan. Shared by bench/tp_step_bench.cpp and tests/dist/tp_worker.cpp.
#pragma once

#include <loom/loom.hpp>
#include <loom/tp/parallelize.hpp>

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <type_traits>

namespace loom_bench {

template <bool Parallel>
struct TpBlockImpl : torch::nn::Module {
  using L = std::conditional_t<Parallel, loom::tp::Linear, torch::nn::Linear>;
  using N = std::conditional_t<Parallel, loom::tp::LayerNorm, torch::nn::LayerNorm>;
  int64_t dim, heads, local_heads;  // parallelize_fn divides local_heads by the group size
  TpBlockImpl(int64_t dim, int64_t heads, int64_t hidden)
      : dim(dim), heads(heads), local_heads(heads),
        ln1(register_module("ln1", N(torch::nn::LayerNormOptions({dim})))),
        ln2(register_module("ln2", N(torch::nn::LayerNormOptions({dim})))),
        attn_in(register_module("attn_in", loom::tp::Prepare())),
        mlp_in(register_module("mlp_in", loom::tp::Prepare())),
        wq(register_module("wq", L(dim, dim))),
        wk(register_module("wk", L(dim, dim))),
        wv(register_module("wv", L(dim, dim))),
        wo(register_module("wo", L(dim, dim))),
        w1(register_module("w1", L(dim, hidden))),
        w2(register_module("w2", L(hidden, dim))) {}
  // x may be this rank's part of the sequence (sequence parallel): the
  // attention sees the whole sequence after attn_in.
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = attn_in(ln1(x));
    const int64_t b = h.size(0), t = h.size(1), hd = dim / heads;
    auto split = [&](const at::Tensor& y) { return y.view({b, t, local_heads, hd}).transpose(1, 2); };
    const at::Tensor q = split(wq(h)), k = split(wk(h)), v = split(wv(h));
    const at::Tensor mask = at::ones({t, t}, at::kBool).triu(1);
    const at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).div(std::sqrt(static_cast<double>(hd)));
    const at::Tensor attention =
        at::matmul(at::softmax(scores.masked_fill(mask, -1e9), -1), v).transpose(1, 2).reshape({b, t, local_heads * hd});
    const at::Tensor mid = x + wo(attention);
    return mid + w2(torch::gelu(w1(mlp_in(ln2(mid)))));
  }
  N ln1, ln2;
  loom::tp::Prepare attn_in, mlp_in;
  L wq, wk, wv, wo, w1, w2;
};

// The plan: attention and MLP each entered through a Prepare (one gradient
// all-reduce each), wq/wk/wv/w1 column-wise, wo/w2 row-wise (one all-reduce
// each); with sequence parallelism the residual stream is sharded along the
// sequence and the LayerNorms run on their part.
inline void parallelize_block(torch::nn::Module& module, loom::comm::device_mesh& mesh, bool sequence) {
  using loom::tp::colwise_parallel;
  using loom::tp::prepare_module_input;
  using loom::tp::rowwise_parallel;
  const colwise_parallel after_prepare{.input_prepared = true};
  if (sequence) {
    const prepare_module_input gather{.input_layout = loom::tp::shard(1)};
    const rowwise_parallel scatter{.output_layout = loom::tp::shard(1)};
    loom::tp::parallelize_module(module, mesh,
                                 {{"ln1", loom::tp::sequence_parallel{}}, {"attn_in", gather},
                                  {"wq", after_prepare}, {"wk", after_prepare}, {"wv", after_prepare},
                                  {"wo", scatter}, {"ln2", loom::tp::sequence_parallel{}},
                                  {"mlp_in", gather}, {"w1", after_prepare}, {"w2", scatter}});
  } else {
    loom::tp::parallelize_module(module, mesh,
                                 {{"attn_in", prepare_module_input{}},
                                  {"wq", after_prepare}, {"wk", after_prepare}, {"wv", after_prepare},
                                  {"wo", rowwise_parallel{}},
                                  {"mlp_in", prepare_module_input{}},
                                  {"w1", after_prepare}, {"w2", rowwise_parallel{}}});
  }
  auto& block = dynamic_cast<TpBlockImpl<true>&>(module);
  block.local_heads = block.heads / mesh.size("tensor_parallel");
}

}  // namespace loom_bench
