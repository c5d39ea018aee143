// Small models and data shared by the tests.
#pragma once

#include <loom/environment.hpp>

#include <ATen/ATen.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <string>

namespace loom_test {

// An MLP that records the dtype its hidden activations had in the last forward.
struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))) {}

  at::Tensor forward(const at::Tensor& x) {
    auto h = fc1->forward(x.flatten(1));
    hidden_dtype = h.scalar_type();
    h = torch::relu(h);
    h = torch::relu(fc2->forward(h));
    return fc3->forward(h);
  }

  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  c10::ScalarType hidden_dtype = c10::ScalarType::Undefined;
};
TORCH_MODULE(Mlp);

// A learnable synthetic task: labels from a fixed random linear map.
struct synthetic_task {
  at::Tensor inputs;   // [steps, batch, features]
  at::Tensor targets;  // [steps, batch]
};

inline synthetic_task make_task(int64_t steps, int64_t batch, int64_t features, int64_t classes, uint64_t seed) {
  auto generator = at::detail::createCPUGenerator(seed);
  auto inputs = at::randn({steps, batch, features}, generator);
  auto projection = at::randn({features, classes}, generator);
  auto targets = at::matmul(inputs, projection).argmax(-1);
  return {inputs, targets};
}

inline std::string fixtures_dir() {
  return loom::cluster::setting_text("LOOM_FIXTURES_DIR").value_or("tests-fixtures");
}

// A private directory for one test, removed with everything in it afterwards.
class scratch_dir {
 public:
  explicit scratch_dir(const std::string& name) {
    std::string pattern = (std::filesystem::temp_directory_path() / ("loom-" + name + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace loom_test
