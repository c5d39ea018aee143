// torch.utils.data.DistributedSampler's semantics as a LibTorch sampler: the
// same index lists for the same (size, replicas, rank, shuffle, seed, epoch,
// drop_last). With one replica it is the single-process shuffling sampler.
#pragma once

#include <torch/data/samplers/base.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace loom::data {

struct sampler_options {
  std::size_t num_replicas = 1;
  std::size_t rank = 0;
  bool shuffle = false;
  std::uint64_t seed = 0;
  bool drop_last = false;
};

// The epoch is shared with the loader wrapper, which sets it before each pass
// (Fabric's set_epoch on every new iteration); LibTorch's loader owns the sampler.
struct sampler_epoch {
  std::int64_t value = 0;
  // Samples of this rank's list to skip at the start of the next pass, once:
  // a resumed epoch continues where the checkpoint left it, without loading
  // the batches it skips.
  std::size_t skip = 0;
};

class distributed_sampler : public torch::data::samplers::Sampler<> {
 public:
  distributed_sampler(std::size_t dataset_size, sampler_options options,
                      std::shared_ptr<sampler_epoch> epoch = std::make_shared<sampler_epoch>());

  // Recomputes this rank's indices for the current epoch.
  void reset(c10::optional<std::size_t> new_size = c10::nullopt) override;
  c10::optional<std::vector<std::size_t>> next(std::size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  void set_epoch(std::int64_t epoch) noexcept { epoch_->value = epoch; }
  std::int64_t epoch() const noexcept { return epoch_->value; }
  // Samples this rank sees per epoch (torch's num_samples).
  std::size_t num_samples() const noexcept { return num_samples_; }
  const std::vector<std::size_t>& indices() const noexcept { return indices_; }
  std::size_t position() const noexcept { return position_; }
  const std::shared_ptr<sampler_epoch>& epoch_handle() const noexcept { return epoch_; }

 private:
  void compute_sizes();

  std::size_t dataset_size_;
  sampler_options options_;
  std::shared_ptr<sampler_epoch> epoch_;
  std::size_t num_samples_ = 0;
  std::size_t total_size_ = 0;
  std::vector<std::size_t> indices_;
  std::size_t position_ = 0;
};

}  // namespace loom::data
