// A dataset held in two tensors (inputs, targets) whose batches are gathered
// with one index_select each, instead of stacking one example at a time.
#pragma once

#include <loom/errors.hpp>

#include <ATen/ATen.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <string>

namespace loom::data {

class tensor_dataset : public torch::data::datasets::BatchDataset<tensor_dataset, torch::data::Example<>> {
 public:
  tensor_dataset(at::Tensor inputs, at::Tensor targets) : inputs_(std::move(inputs)), targets_(std::move(targets)) {
    if (inputs_.dim() == 0 || targets_.dim() == 0 || inputs_.size(0) != targets_.size(0)) {
      throw data_error("tensor_dataset: inputs and targets must have the same first dimension (got " +
                       std::to_string(inputs_.dim() ? inputs_.size(0) : 0) + " and " +
                       std::to_string(targets_.dim() ? targets_.size(0) : 0) + ")");
    }
  }

  torch::data::Example<> get_batch(c10::ArrayRef<size_t> indices) override {
    static_assert(sizeof(size_t) == sizeof(int64_t));
    // The indices are non-negative and below 2^63, so the bits are the same.
    auto index = at::from_blob(const_cast<size_t*>(indices.data()), {static_cast<int64_t>(indices.size())}, at::kLong);
    return {inputs_.index_select(0, index), targets_.index_select(0, index)};
  }

  c10::optional<size_t> size() const override { return static_cast<size_t>(inputs_.size(0)); }

  const at::Tensor& inputs() const noexcept { return inputs_; }
  const at::Tensor& targets() const noexcept { return targets_; }

 private:
  at::Tensor inputs_;
  at::Tensor targets_;
};

}  // namespace loom::data
