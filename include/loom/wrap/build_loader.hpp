// The loader setup_dataloaders builds: LibTorch's StatelessDataLoader over the
// dataset with loom's distributed sampler (torch DistributedSampler
// semantics), per-rank, per-worker generators, and batches moved to the
// device. Shared by the static and the erased Fabric.
#pragma once

#include <loom/data/distributed_sampler.hpp>
#include <loom/data/worker_seed.hpp>
#include <loom/errors.hpp>
#include <loom/util/seed.hpp>
#include <loom/wrap/dataloader.hpp>

#include <c10/core/Device.h>
#include <torch/data/dataloader.h>
#include <torch/data/datasets/map.h>
#include <torch/data/transforms/stack.h>

#include <memory>
#include <vector>

namespace loom::detail {

template <class T>
inline constexpr bool is_vector = false;
template <class T, class Alloc>
inline constexpr bool is_vector<std::vector<T, Alloc>> = true;

template <class Dataset>
auto build_sampled_loader(Dataset dataset, const loader_options& options, int world_size, int rank,
                          c10::Device device) {
  const auto size = dataset.size();
  if (!size) throw configuration_error("setup_dataloaders: the dataset has no size; loom needs it to sample");
  if (options.batch_size == 0) throw configuration_error("setup_dataloaders: batch_size must be positive");
  data::sampler_options sampling;
  sampling.num_replicas = static_cast<std::size_t>(world_size);
  sampling.rank = static_cast<std::size_t>(rank);
  sampling.shuffle = options.shuffle;
  sampling.seed = options.seed ? *options.seed : global_seed_from_environment().value_or(0);
  auto epoch = std::make_shared<data::sampler_epoch>();
  data::distributed_sampler sampler(*size, sampling, epoch);
  const std::size_t samples = sampler.num_samples();
  const std::size_t batches =
      options.drop_last ? samples / options.batch_size : (samples + options.batch_size - 1) / options.batch_size;
  // Each worker of each rank draws from its own generator (data::worker_generator()).
  using seeded_t = data::seeded_dataset<Dataset>;
  using loader_t = torch::data::StatelessDataLoader<seeded_t, data::distributed_sampler>;
  auto loader = std::make_unique<loader_t>(seeded_t(std::move(dataset), sampling.seed, sampling.rank),
                                           std::move(sampler),
                                           torch::data::DataLoaderOptions()
                                               .batch_size(options.batch_size)
                                               .workers(options.workers)
                                               .drop_last(options.drop_last));
  return fabric_dataloader<loader_t>(std::move(loader), device, options.move_to_device, std::move(epoch), batches,
                                     options.batch_size);
}

// Per-example datasets have their examples stacked into batches.
template <class Dataset>
auto build_loader(Dataset dataset, const loader_options& options, int world_size, int rank, c10::Device device) {
  if constexpr (is_vector<typename Dataset::BatchType>) {
    return build_sampled_loader(std::move(dataset).map(torch::data::transforms::Stack<>()), options, world_size,
                                rank, device);
  } else {
    return build_sampled_loader(std::move(dataset), options, world_size, rank, device);
  }
}

}  // namespace loom::detail
