#include <loom/data/distributed_sampler.hpp>
#include <loom/errors.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <string>

namespace loom::data {

distributed_sampler::distributed_sampler(std::size_t dataset_size, sampler_options options,
                                         std::shared_ptr<sampler_epoch> epoch)
    : dataset_size_(dataset_size), options_(options), epoch_(std::move(epoch)) {
  if (options_.num_replicas == 0) throw configuration_error("distributed_sampler: num_replicas must be positive");
  if (options_.rank >= options_.num_replicas) {
    throw configuration_error("distributed_sampler: rank " + std::to_string(options_.rank) +
                              " is not below num_replicas " + std::to_string(options_.num_replicas));
  }
  if (!epoch_) epoch_ = std::make_shared<sampler_epoch>();
  compute_sizes();
  reset();
}

void distributed_sampler::compute_sizes() {
  const std::size_t replicas = options_.num_replicas;
  if (options_.drop_last && dataset_size_ % replicas != 0) {
    // Drop the tail so every rank gets the same count: ceil((n - W) / W).
    num_samples_ = dataset_size_ < replicas ? 0 : (dataset_size_ - replicas + replicas - 1) / replicas;
  } else {
    num_samples_ = (dataset_size_ + replicas - 1) / replicas;
  }
  total_size_ = num_samples_ * replicas;
}

void distributed_sampler::reset(c10::optional<std::size_t> new_size) {
  if (new_size) {
    dataset_size_ = *new_size;
    compute_sizes();
  }
  std::vector<std::size_t> all(dataset_size_);
  if (options_.shuffle) {
    // torch: g.manual_seed(seed + epoch); randperm(n, generator=g).
    auto generator = at::detail::createCPUGenerator(options_.seed + static_cast<std::uint64_t>(epoch_->value));
    const at::Tensor permutation = at::randperm(static_cast<int64_t>(dataset_size_), generator, at::kLong);
    const auto* values = permutation.data_ptr<int64_t>();
    for (std::size_t i = 0; i < dataset_size_; ++i) all[i] = static_cast<std::size_t>(values[i]);
  } else {
    for (std::size_t i = 0; i < dataset_size_; ++i) all[i] = i;
  }
  if (!options_.drop_last) {
    // Pad by repeating the list from its start up to a multiple of the replicas.
    const std::size_t original = all.size();
    for (std::size_t i = 0; all.size() < total_size_ && original > 0; ++i) all.push_back(all[i % original]);
  } else {
    all.resize(total_size_);
  }
  indices_.clear();
  indices_.reserve(num_samples_);
  for (std::size_t i = options_.rank; i < total_size_; i += options_.num_replicas) indices_.push_back(all[i]);
  position_ = std::min(epoch_->skip, indices_.size());
  epoch_->skip = 0;
}

c10::optional<std::vector<std::size_t>> distributed_sampler::next(std::size_t batch_size) {
  if (position_ >= indices_.size()) return c10::nullopt;
  const std::size_t end = std::min(indices_.size(), position_ + batch_size);
  std::vector<std::size_t> batch(indices_.begin() + static_cast<std::ptrdiff_t>(position_),
                                 indices_.begin() + static_cast<std::ptrdiff_t>(end));
  position_ = end;
  return batch;
}

void distributed_sampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", at::tensor(static_cast<int64_t>(epoch_->value)), /*is_buffer=*/true);
  archive.write("position", at::tensor(static_cast<int64_t>(position_)), /*is_buffer=*/true);
}

void distributed_sampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor epoch = at::empty({}, at::kLong);
  at::Tensor position = at::empty({}, at::kLong);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  epoch_->value = epoch.item<int64_t>();
  reset();
  position_ = std::min<std::size_t>(static_cast<std::size_t>(position.item<int64_t>()), indices_.size());
}

}  // namespace loom::data
