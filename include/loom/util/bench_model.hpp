// A model for loom-bench from a user's shared library: what the library
// gives, and the one entry point it exports.
//
//   loom-bench --model-library ./libmy_model.so --model-options "dim=512,layers=4"
//
// The library implements
//
//   extern "C" void loom_bench_model(const char* options, loom::bench::model_family& family);
//
// filling `family` (throwing std::exception with what is wrong for options
// it does not accept). It must be built against the same LibTorch and loom
// headers as loom-bench: the family holds C++ objects.
// examples/char_transformer_bench.cpp is one (the char transformer's
// blocks, built as build/examples/libloom_bench_char_transformer.so).
//
// loom-bench seeds the generator (at::manual_seed(0)) before each build, so
// every rank and every cell starts from the same weights; it trains with
// --optimizer's optimizer (Adam, lr 1e-3, unless sgd) on one fixed batch
// per data-parallel rank.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

namespace loom::comm {
class device_mesh;
}

namespace loom::bench {

// The model: a batch of inputs in, what the loss reads out.
class model : public torch::nn::Module {
 public:
  virtual at::Tensor forward(at::Tensor inputs) = 0;
};

// The holder Fabric's setup takes (a TORCH_MODULE of the abstract model).
class Model : public torch::nn::ModuleHolder<model> {
 public:
  using torch::nn::ModuleHolder<model>::ModuleHolder;
};

struct batch {
  at::Tensor inputs;
  at::Tensor targets;
};

struct model_family {
  std::string description;  // what the table's header says: "char transformer: 2 blocks, dim 128, ..."
  // A fresh model on the CPU (called after at::manual_seed(0)).
  std::function<std::shared_ptr<model>()> build;
  // A data-parallel rank's fixed batch of `samples` samples.
  std::function<batch(std::int64_t samples, int data_parallel_rank)> make_batch;
  // The scalar loss of an output against its batch's targets.
  std::function<at::Tensor(const at::Tensor& output, const at::Tensor& targets)> loss;
  // model_parallel's plan (parallelize_fn); empty: loom-bench refuses
  // model_parallel for this model.
  std::function<void(torch::nn::Module& module, loom::comm::device_mesh& mesh)> parallelize;
};

// Reads a library's options, "KEY=N,KEY=N" (each N a whole number >= 1),
// into the fields `keys` names; keys left out keep their values. Throws
// std::invalid_argument naming the item and the keys accepted.
inline void read_whole_number_options(const std::string& text, const std::map<std::string, std::int64_t*>& keys) {
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    if (item.empty()) continue;
    const auto equals = item.find('=');
    const auto key = keys.find(item.substr(0, equals));
    std::size_t used = 0;
    long long value = 0;
    if (equals != std::string::npos && key != keys.end()) {
      try {
        value = std::stoll(item.substr(equals + 1), &used);
      } catch (const std::exception&) {
        used = 0;
      }
    }
    if (key == keys.end() || used == 0 || used != item.size() - equals - 1 || value < 1) {
      std::string accepted;
      for (const auto& [name, field] : keys) accepted += (accepted.empty() ? "" : ", ") + name;
      throw std::invalid_argument("'" + item + "' is not KEY=N with KEY one of " + accepted + " and N >= 1");
    }
    *key->second = value;
  }
}

// The entry point's name and type.
inline constexpr const char* model_entry_point = "loom_bench_model";
using model_entry = void (*)(const char* options, model_family& family);

}  // namespace loom::bench
