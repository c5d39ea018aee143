// What setup_dataloaders returns: a LibTorch data loader whose batches arrive
// on the strategy's device, and whose sampler gets a new epoch on every pass.
#pragma once

#include <loom/data/distributed_sampler.hpp>
#include <loom/util/apply_to_collection.hpp>

#include <c10/core/Device.h>
#include <torch/data/dataloader.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>

namespace loom {

// Options of a loader that setup_dataloaders builds from a dataset.
struct loader_options {
  std::size_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  // LibTorch's loader threads, each with a copy of the dataset and a random
  // generator of its own (data::worker_generator(), seeded per rank and
  // worker). Batches go to whichever thread is free, so a dataset that draws
  // random numbers is reproducible only with 0 workers.
  std::size_t workers = 0;
  // Seed of the shuffling order (seed + epoch, as torch's DistributedSampler).
  // Unset: PL_GLOBAL_SEED (set by seed_everything) when present, else 0, so
  // every rank draws the same order.
  std::optional<std::uint64_t> seed;
  bool move_to_device = true;
};

namespace detail {
inline at::Tensor move_tensor(const at::Tensor& tensor, const c10::Device& device) {
  return tensor.device() == device ? tensor : tensor.to(device);
}
}  // namespace detail

template <class Loader>
class fabric_dataloader {
 public:
  using batch_type = typename Loader::BatchType;

  class iterator {
   public:
    using inner = torch::data::Iterator<batch_type>;
    using iterator_category = std::input_iterator_tag;
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using reference = batch_type&;
    using pointer = batch_type*;

    iterator(inner it, const fabric_dataloader* owner) : it_(std::move(it)), owner_(owner) {}

    batch_type& operator*() {
      if (!moved_) {
        auto& batch = *it_;
        if (owner_->move_to_device_) {
          batch = apply_to_collection(std::move(batch),
                                      [this](const at::Tensor& t) { return detail::move_tensor(t, owner_->device_); });
        }
        moved_ = true;
      }
      return *it_;
    }
    batch_type* operator->() { return &**this; }
    iterator& operator++() {
      ++it_;
      moved_ = false;
      return *this;
    }
    bool operator==(const iterator& other) const { return it_ == other.it_; }
    bool operator!=(const iterator& other) const { return !(*this == other); }

   private:
    inner it_;
    const fabric_dataloader* owner_;
    bool moved_ = false;
  };

  fabric_dataloader(std::unique_ptr<Loader> loader, c10::Device device, bool move_to_device,
                    std::shared_ptr<data::sampler_epoch> epoch, std::optional<std::size_t> num_batches,
                    std::size_t batch_size = 0)
      : loader_(std::move(loader)),
        device_(device),
        move_to_device_(move_to_device),
        epoch_(std::move(epoch)),
        num_batches_(num_batches),
        batch_size_(batch_size) {}

  // Each pass is a new epoch for the sampler (Fabric calls set_epoch with the
  // number of earlier passes).
  iterator begin() {
    if (epoch_) epoch_->value = passes_;
    ++passes_;
    return iterator(loader_->begin(), this);
  }
  iterator end() { return iterator(loader_->end(), this); }

  // Batches per pass, when the loader was built from a sized dataset.
  std::optional<std::size_t> size() const noexcept { return num_batches_; }
  std::int64_t epoch() const noexcept { return epoch_ ? epoch_->value : passes_ - 1; }
  // Continue from a given number of finished passes (resume).
  void set_passes(std::int64_t passes) noexcept { passes_ = passes; }
  // The next pass is epoch `passes` and starts after its first `batches`
  // batches, which are skipped without being loaded (exact resume inside an
  // epoch). Needs the sampler of a loader setup_dataloaders built.
  void resume_at(std::int64_t passes, std::size_t batches) {
    if (batches > 0 && !epoch_) {
      throw std::logic_error("fabric_dataloader::resume_at: this loader was not built by setup_dataloaders, so it "
                             "cannot start a pass in the middle");
    }
    passes_ = passes;
    if (epoch_) epoch_->skip = batches * batch_size_;
  }
  std::size_t batch_size() const noexcept { return batch_size_; }
  const c10::Device& device() const noexcept { return device_; }
  Loader& loader() noexcept { return *loader_; }

 private:
  std::unique_ptr<Loader> loader_;
  c10::Device device_;
  bool move_to_device_;
  std::shared_ptr<data::sampler_epoch> epoch_;
  std::optional<std::size_t> num_batches_;
  std::size_t batch_size_;
  std::int64_t passes_ = 0;
};

}  // namespace loom
