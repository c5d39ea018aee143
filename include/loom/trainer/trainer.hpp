// loom::trainer: Lightning's "build your own trainer" as a reusable piece,
// generic over the Fabric type (a static Fabric<A, S, P> or an AnyFabric)
// and over a module that models the trainable contract (trainable.hpp).
//
//   loom::trainer trainer(fabric, {.max_epochs = 5, .grad_accum_steps = 2});
//   auto result = trainer.fit(model, train_set, val_set,
//                             {.train_loader = {.batch_size = 64, .shuffle = true},
//                              .val_loader = {.batch_size = 1000}, .resume = "last"});
//
// The loop: epochs of training batches (accumulated over grad_accum_steps
// with no_backward_sync), optimizer and scheduler steps, validation every
// validation_frequency epochs (metrics reduced over ranks), logging to the
// Fabric's loggers, a progress bar, checkpoints every checkpoint_frequency
// epochs and on stop, and exact resume from any of them. Callbacks registered
// with the Fabric get the hooks of callbacks/hooks.hpp, and those of
// trainer/hooks.hpp that they list.
#pragma once

#include <loom/trainer/fit_context.hpp>
#include <loom/trainer/fit_loop.hpp>
#include <loom/trainer/optimization.hpp>
#include <loom/trainer/progress_bar.hpp>
#include <loom/trainer/trainable.hpp>
#include <loom/trainer/trainer_options.hpp>
#include <loom/wrap/build_loader.hpp>
#include <loom/wrap/module.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace loom {

template <class FabricType>
class trainer {
 public:
  explicit trainer(FabricType& fabric, trainer_options options = {})
      : fabric_(&fabric), options_(std::move(options)), bar_(options_.progress_bar, fabric.is_global_zero()) {
    check_options();
  }

  // Fits without validation.
  template <ModuleHolder Holder, class TrainSet>
  fit_result fit(Holder module, TrainSet train_set, const fit_options& options = {}) {
    return fit_with(std::move(module), std::move(train_set), static_cast<std::nullptr_t*>(nullptr), options);
  }

  // Fits, validating on val_set every validation_frequency epochs.
  template <ModuleHolder Holder, class TrainSet, class ValSet>
    requires(!std::is_same_v<std::remove_cvref_t<ValSet>, fit_options>)
  fit_result fit(Holder module, TrainSet train_set, ValSet val_set, const fit_options& options = {}) {
    return fit_with(std::move(module), std::move(train_set), &val_set, options);
  }

  const trainer_options& options() const noexcept { return options_; }
  FabricType& fabric() noexcept { return *fabric_; }

 private:
  void check_options() const {
    auto positive = [](std::int64_t value, const char* name) {
      if (value < 1) throw configuration_error(std::string("trainer: ") + name + " must be >= 1, got " + std::to_string(value));
    };
    positive(options_.grad_accum_steps, "grad_accum_steps");
    positive(options_.validation_frequency, "validation_frequency");
    positive(options_.log_every_n_steps, "log_every_n_steps");
    if (options_.checkpoint_frequency < 0) throw configuration_error("trainer: checkpoint_frequency must be >= 0 (0: only on stop)");
    if (!options_.max_epochs && !options_.max_steps) {
      throw configuration_error("trainer: set max_epochs or max_steps (or both); with neither, fit would never end");
    }
    if (options_.max_epochs && *options_.max_epochs < 0) throw configuration_error("trainer: max_epochs must be >= 0");
    if (options_.max_steps && *options_.max_steps < 0) throw configuration_error("trainer: max_steps must be >= 0");
    if (options_.limit_train_batches && *options_.limit_train_batches < 0) {
      throw configuration_error("trainer: limit_train_batches must be >= 0");
    }
    if (options_.limit_val_batches && *options_.limit_val_batches < 0) {
      throw configuration_error("trainer: limit_val_batches must be >= 0");
    }
    if (options_.gradient_clip_val && *options_.gradient_clip_val <= 0) {
      throw configuration_error("trainer: gradient_clip_val must be positive");
    }
  }

  // A loader over dataset: the Fabric's (sharded by rank) or one that gives
  // every rank the whole dataset.
  template <class Dataset>
  auto make_loader(Dataset dataset, const loader_options& options) {
    if (options_.use_distributed_sampler) return fabric_->setup_dataloaders(std::move(dataset), options);
    return detail::build_loader(std::move(dataset), options, 1, 0, fabric_->device());
  }

  template <class Holder, class TrainSet, class ValSet>
  fit_result fit_with(Holder module, TrainSet train_set, ValSet* val_set, const fit_options& options) {
    using impl_type = module_impl_t<Holder>;
    constexpr bool has_validation = !std::is_same_v<ValSet, std::nullptr_t>;
    auto train = make_loader(std::move(train_set), options.train_loader);
    using train_loader_t = decltype(train);
    using batch_type = typename train_loader_t::batch_type;
    static_assert(detail::diagnose_trainable<impl_type, batch_type, has_validation>());

    using returned_t = std::remove_cvref_t<decltype(module->configure_optimizers())>;
    using optimizer_t = typename detail::optimization_of<returned_t>::optimizer_type;
    optimization<optimizer_t> optimization = detail::optimization_of<returned_t>::make(module->configure_optimizers());
    if (!optimization.optimizer) throw configuration_error("trainer: configure_optimizers() returned no optimizer");
    if (optimization.frequency < 1) throw configuration_error("trainer: the scheduler's frequency must be >= 1");
    auto [model, optimizer] = fabric_->setup(std::move(module), *optimization.optimizer);

    lr_scheduler* scheduler = optimization.scheduler ? &*optimization.scheduler : nullptr;
    context_ = fit_context();
    context_.global_rank_ = fabric_->global_rank();
    context_.world_size_ = fabric_->world_size();
    context_.checkpoint_dir_ = options_.checkpoint_dir;
    context_.log_every_n_steps_ = options_.log_every_n_steps;
    context_.optimizer_ = &optimizer.optimizer();
    context_.scheduler_ = scheduler;

    auto run = [&](auto* val) {
      using val_loader_t = std::remove_pointer_t<decltype(val)>;
      detail::fit_loop<FabricType, decltype(model), decltype(optimizer), train_loader_t, val_loader_t> loop(
          *fabric_, options_, context_, bar_, model, optimizer, scheduler, optimization.interval,
          optimization.frequency, train, val);
      context_.save_ = [&loop](const std::string& path) { loop.save_to(path); };
      context_.log_ = [this](const metrics& values, std::int64_t step) { fabric_->log_dict(values, step); };
      // The context outlives the loop: its actions end with it, even when fit throws.
      struct detach_actions {
        fit_context& context;
        ~detach_actions() {
          context.save_ = nullptr;
          context.log_ = nullptr;
        }
      } detach{context_};
      return loop.run(options.resume);
    };
    if constexpr (has_validation) {
      auto val = make_loader(std::move(*val_set), options.val_loader);
      return run(&val);
    } else {
      return run(static_cast<std::nullptr_t*>(nullptr));
    }
  }

  FabricType* fabric_;
  trainer_options options_;
  progress_bar bar_;
  fit_context context_;
};

}  // namespace loom
