// The char transformer (examples/char_transformer_model.hpp) as a model
// library for loom-bench: its entry point loom_bench_model, the documented
// way to give loom-bench any model (loom/util/bench_model.hpp).
//
//   build/tools/loom-bench --model-library build/examples/libloom_bench_char_transformer.so
//       --model-options layers=1,dim=128,heads=4,context=64 --batch 8 --strategies raw,ddp,fsdp,model_parallel
//
// Options: context, dim, heads, layers (KEY=VALUE, comma-separated; the
// example's defaults otherwise). A batch is `samples` windows of `context`
// random bytes and the bytes that follow them (the cost of a step does not
// depend on the text); the loss is the next byte's cross-entropy. Its plan
// under model_parallel is the example's: vocabulary-parallel embedding,
// attention heads and MLP column- then row-wise, a column-wise head.
#include "char_transformer_model.hpp"

#include <loom/util/bench_model.hpp>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>

namespace {

struct bench_model : loom::bench::model {
  explicit bench_model(const char_transformer::shape& shape)
      : net(register_module("net", char_transformer::CharTransformer(shape))) {}
  at::Tensor forward(at::Tensor ids) override { return net(ids).reshape({-1, char_transformer::vocabulary}); }
  char_transformer::CharTransformer net;
};

char_transformer::shape parse(const std::string& text) {
  char_transformer::shape shape;
  std::map<std::string, int64_t*> keys{
      {"context", &shape.context}, {"dim", &shape.dim}, {"heads", &shape.heads}, {"layers", &shape.layers}};
  loom::bench::read_whole_number_options(text, keys);
  if (shape.dim % shape.heads != 0) {
    throw std::invalid_argument("dim " + std::to_string(shape.dim) + " does not split into " +
                                std::to_string(shape.heads) + " heads");
  }
  return shape;
}

}  // namespace

extern "C" void loom_bench_model(const char* options, loom::bench::model_family& family) {
  const char_transformer::shape shape = parse(options != nullptr ? options : "");
  family.description = "char transformer: " + std::to_string(shape.layers) + " block(s), dim " +
                       std::to_string(shape.dim) + ", " + std::to_string(shape.heads) + " heads, context " +
                       std::to_string(shape.context) + " bytes (examples/char_transformer_bench.cpp)";
  family.build = [shape] { return std::make_shared<bench_model>(shape); };
  family.make_batch = [shape](int64_t samples, int data_parallel_rank) {
    at::manual_seed(1 + data_parallel_rank);
    const at::Tensor bytes = at::randint(0, char_transformer::vocabulary, {samples, shape.context + 1}, at::kLong);
    return loom::bench::batch{bytes.narrow(1, 0, shape.context).contiguous(),
                              bytes.narrow(1, 1, shape.context).reshape({-1})};
  };
  family.loss = [](const at::Tensor& logits, const at::Tensor& targets) {
    return torch::nn::functional::cross_entropy(logits, targets);
  };
  family.parallelize = [](torch::nn::Module& module, loom::comm::device_mesh& mesh) {
    char_transformer::parallelize(*dynamic_cast<bench_model&>(module).net, mesh);
  };
}
