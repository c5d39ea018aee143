// Per-rank, per-worker random generators for data loading. LibTorch's loader
// threads share torch's one global generator, so a dataset that draws random
// numbers (augmentation) in get_batch would draw the same stream on every
// rank and interleave it across workers. setup_dataloaders gives each loader
// worker of each rank a generator of its own, seeded from (seed, rank,
// worker); datasets draw from it through worker_generator().
#pragma once

#include <ATen/core/Generator.h>
#include <torch/data/datasets/base.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

namespace loom::data {

// The generator of the loader worker that calls it (inside get_batch). Outside
// a loader built by setup_dataloaders: torch's default CPU generator.
at::Generator worker_generator();

// The seed of worker `worker` on rank `rank` (distinct for distinct pairs).
std::uint64_t worker_seed(std::uint64_t seed, std::size_t rank, int worker);

namespace detail {
void set_worker_generator(const at::Generator* generator) noexcept;
at::Generator make_worker_generator(std::uint64_t seed);
}  // namespace detail

// Wraps a batch dataset so that each copy LibTorch gives a worker thread
// gets its worker number and generator on its first batch.
template <class Dataset>
class seeded_dataset
    : public torch::data::datasets::BatchDataset<seeded_dataset<Dataset>, typename Dataset::BatchType,
                                                 typename Dataset::BatchRequestType> {
 public:
  using batch_type = typename Dataset::BatchType;
  using request_type = typename Dataset::BatchRequestType;

  seeded_dataset(Dataset dataset, std::uint64_t seed, std::size_t rank)
      : dataset_(std::move(dataset)), seed_(seed), rank_(rank), workers_(std::make_shared<std::atomic<int>>(0)) {}

  batch_type get_batch(request_type request) override {
    if (!generator_) {
      worker_ = workers_->fetch_add(1);
      generator_ = detail::make_worker_generator(worker_seed(seed_, rank_, worker_));
    }
    detail::set_worker_generator(&*generator_);
    batch_type batch = dataset_.get_batch(std::move(request));
    detail::set_worker_generator(nullptr);
    return batch;
  }

  c10::optional<size_t> size() const override { return dataset_.size(); }
  int worker() const noexcept { return worker_; }

 private:
  Dataset dataset_;
  std::uint64_t seed_;
  std::size_t rank_;
  std::shared_ptr<std::atomic<int>> workers_;  // shared by every copy: hands out worker numbers
  std::optional<at::Generator> generator_;
  int worker_ = -1;
};

}  // namespace loom::data
