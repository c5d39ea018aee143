#include "model_families.hpp"

#include <loom/comm/device_mesh.hpp>
#include <loom/errors.hpp>
#include <loom/strategy/unit.hpp>
#include <loom/tp/layers.hpp>
#include <loom/tp/parallelize.hpp>

#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <torch/nn/functional/loss.h>

#include <dlfcn.h>

#include <memory>
#include <string>
#include <utility>

namespace loom_bench {

namespace {

struct mlp : loom::bench::model {
  explicit mlp(const std::vector<std::int64_t>& widths) {
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
      layers.push_back(register_module("fc" + std::to_string(i),
                                       loom::unit<loom::tp::Linear>(widths[i], widths[i + 1])));
    }
  }
  at::Tensor forward(at::Tensor x) override {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      x = layers[i](x);
      if (i + 1 < layers.size()) x = at::relu(x);
    }
    return x;
  }
  std::vector<loom::unit<loom::tp::Linear>> layers;
};

void parallelize_mlp(torch::nn::Module& module, loom::comm::device_mesh& mesh, std::size_t layers) {
  using loom::tp::replicate;
  loom::tp::parallelize_plan plan;
  for (std::size_t i = 0; i < layers; ++i) {
    const std::string name = "fc" + std::to_string(i);
    if (i % 2 == 1) plan.emplace_back(name, loom::tp::rowwise_parallel{});
    else if (i + 1 == layers) plan.emplace_back(name, loom::tp::colwise_parallel{.output_layout = replicate()});
    else plan.emplace_back(name, loom::tp::colwise_parallel{});
  }
  loom::tp::parallelize_module(module, mesh, plan);
}

}  // namespace

loom::bench::model_family mlp_family(const std::vector<std::int64_t>& widths) {
  std::string shape;
  for (const auto width : widths) shape += (shape.empty() ? "" : ",") + std::to_string(width);
  const std::size_t layers = widths.size() - 1;
  return {.description = "MLP " + shape,
          .build = [widths] { return std::make_shared<mlp>(widths); },
          .make_batch =
              [widths](std::int64_t samples, int data_parallel_rank) {
                at::manual_seed(1 + data_parallel_rank);
                return loom::bench::batch{at::randn({samples, widths.front()}),
                                          at::randint(0, widths.back(), {samples})};
              },
          .loss = [](const at::Tensor& output,
                     const at::Tensor& targets) { return torch::nn::functional::cross_entropy(output, targets); },
          .parallelize = [layers](torch::nn::Module& module,
                                  loom::comm::device_mesh& mesh) { parallelize_mlp(module, mesh, layers); }};
}

loom::bench::model_family library_family(const std::string& path, const std::string& options) {
  // A path without a slash would be looked up on the library path, not here.
  const std::string where = path.find('/') == std::string::npos ? "./" + path : path;
  void* library = dlopen(where.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    throw loom::configuration_error("loom-bench: the model library " + path + " cannot be loaded: " +
                                    (why != nullptr ? why : "unknown error"));
  }
  auto* entry = reinterpret_cast<loom::bench::model_entry>(dlsym(library, loom::bench::model_entry_point));
  if (entry == nullptr) {
    throw loom::configuration_error("loom-bench: the model library " + path + " exports no " +
                                    std::string(loom::bench::model_entry_point) +
                                    " (extern \"C\" void loom_bench_model(const char* options, "
                                    "loom::bench::model_family& family); loom/util/bench_model.hpp)");
  }
  loom::bench::model_family family;
  try {
    entry(options.c_str(), family);
  } catch (const std::exception& error) {
    throw loom::configuration_error("loom-bench: the model library " + path + " refused --model-options '" +
                                    options + "': " + error.what());
  }
  if (!family.build || !family.make_batch || !family.loss) {
    throw loom::configuration_error("loom-bench: the model library " + path +
                                    " left build, make_batch or loss empty (loom/util/bench_model.hpp)");
  }
  if (family.description.empty()) family.description = "the model of " + path;
  return family;
}

}  // namespace loom_bench
