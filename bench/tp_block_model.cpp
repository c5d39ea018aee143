// bench/tp_block.hpp's transformer block as a model library for loom-bench
// (loom/util/bench_model.hpp): what bench/tp_step.sh measures. A compute-bound
// pre-norm block, hidden 1024, 16 heads, MLP 4096, on a batch of `samples`
// sequences of 256 (normal inputs and targets, mean squared error), and its
// tensor-parallel plan (Prepare, column-wise wq/wk/wv/w1, row-wise wo/w2).
//
//   build/tools/loom-bench --model-library build/bench/libloom_bench_tp_block.so --batch 8
//       --strategies model_parallel --optimizer sgd --world-sizes 1,2
//
// Options: dim, heads, hidden, sequence (KEY=VALUE, comma-separated).
#include "tp_block.hpp"

#include <loom/util/bench_model.hpp>

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>

namespace {

using Block = torch::nn::ModuleHolder<loom_bench::TpBlockImpl<true>>;

struct block_model : loom::bench::model {
  block_model(int64_t dim, int64_t heads, int64_t hidden) : block(register_module("block", Block(dim, heads, hidden))) {}
  at::Tensor forward(at::Tensor x) override { return block(x); }
  Block block;
};

struct shape {
  int64_t dim = 1024;
  int64_t heads = 16;
  int64_t hidden = 4096;
  int64_t sequence = 256;
};

shape parse(const std::string& text) {
  shape s;
  std::map<std::string, int64_t*> keys{{"dim", &s.dim}, {"heads", &s.heads}, {"hidden", &s.hidden},
                                       {"sequence", &s.sequence}};
  loom::bench::read_whole_number_options(text, keys);
  if (s.dim % s.heads != 0) throw std::invalid_argument("dim does not split into heads");
  return s;
}

}  // namespace

extern "C" void loom_bench_model(const char* options, loom::bench::model_family& family) {
  const shape s = parse(options != nullptr ? options : "");
  family.description = "transformer block (bench/tp_block.hpp): hidden " + std::to_string(s.dim) + ", " +
                       std::to_string(s.heads) + " heads, MLP " + std::to_string(s.hidden) + ", sequence " +
                       std::to_string(s.sequence);
  family.build = [s] { return std::make_shared<block_model>(s.dim, s.heads, s.hidden); };
  family.make_batch = [s](int64_t samples, int data_parallel_rank) {
    auto generator = at::detail::createCPUGenerator(1 + static_cast<std::uint64_t>(data_parallel_rank));
    const at::Tensor x = at::randn({samples, s.sequence, s.dim}, generator);
    return loom::bench::batch{x, at::randn({samples, s.sequence, s.dim}, generator)};
  };
  family.loss = [](const at::Tensor& output, const at::Tensor& target) { return at::mse_loss(output, target); };
  family.parallelize = [](torch::nn::Module& module, loom::comm::device_mesh& mesh) {
    loom_bench::parallelize_block(*dynamic_cast<block_model&>(module).block, mesh, /*sequence=*/false);
  };
}
