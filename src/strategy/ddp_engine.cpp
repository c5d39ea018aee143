// c10d::Reducer from C++, as Python's DistributedDataParallel drives it
// (torch/nn/parallel/distributed.py, 1.13): the same bucket plan, the same
// calls before and after forward, the same first-iteration handling of a
// static graph.
#include "../comm/process_group_state.hpp"
#include "pairwise_exchange_hook.hpp"

#include <loom/compat_c10d.hpp>
#include <loom/errors.hpp>
#include <loom/strategy/ddp_engine.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/nn/module.h>

#include <string>
#include <unordered_map>

namespace loom::detail {
namespace {

constexpr std::size_t broadcast_bucket_bytes = 250 * 1024 * 1024;  // Python DDP's _DEFAULT_BROADCAST... (250 MiB)

// Python DDP's _DDPSink for a static graph's first iteration: identity in
// forward; in backward it asks the engine to run the delayed all-reduce once
// backward is done (the reducer learns the graph in that iteration).
struct delayed_allreduce_sink : torch::autograd::Function<delayed_allreduce_sink> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& output, int64_t reducer) {
    context->saved_data["reducer"] = reducer;
    return output.view_as(output);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* context,
                                               torch::autograd::tensor_list gradients) {
    auto* reducer = reinterpret_cast<c10d::Reducer*>(context->saved_data["reducer"].toInt());
    torch::autograd::Engine::get_default_engine().queue_callback([reducer] { reducer->delay_all_reduce(); });
    return {gradients[0], at::Tensor()};
  }
};

std::string without_backtrace(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

}  // namespace

struct ddp_engine::impl {
  ddp_options options;
  torch::nn::Module* module = nullptr;
  comm::process_group group;
  c10::intrusive_ptr<c10d::ProcessGroup> native;
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> buffers;
  std::shared_ptr<c10d::Reducer> reducer;
  // The reducer reports to a logger and dereferences it unchecked (when it
  // looks for unused parameters), so one must exist, as in Python's DDP.
  std::shared_ptr<c10d::Logger> logger;
  bool sync = true;
  // Buckets reduced by loom's own exchange (two ranks on Gloo); otherwise
  // the reducer's all-reduces are counted by the group's sequence number.
  std::atomic<std::uint64_t> exchanges{0};
  bool uses_exchange = false;
  bool forward_param_sync = true;  // Python's require_forward_param_sync
  std::int64_t iterations = 0;
  bool local = false;  // a world of one: every step is local
};

ddp_engine::ddp_engine(torch::nn::Module& module, comm::process_group& world, const ddp_options& options)
    : impl_(std::make_unique<impl>()) {
  auto& self = *impl_;
  self.options = options;
  self.module = &module;
  if (options.bucket_cap_mb <= 0 || options.first_bucket_mb <= 0) {
    throw configuration_error("ddp: bucket_cap_mb and first_bucket_mb must be positive");
  }
  std::unordered_map<std::size_t, std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;  // as DDP: frozen parameters are not synchronised
    names[self.parameters.size()] = item.key();
    self.parameters.push_back(item.value());
  }
  if (self.parameters.empty()) {
    throw configuration_error("ddp: the module has no parameter that requires a gradient; there is nothing to "
                              "synchronise (use loom::parallel for a module that does not train)");
  }
  for (const auto& buffer : module.buffers(/*recurse=*/true)) self.buffers.push_back(buffer);
  // A world of one (DDP started without a launcher, devices=1, as Lightning
  // allows): there is nothing to synchronise, so no group and no reducer.
  if (!world.valid()) {
    self.local = true;
    return;
  }
  // c10d's broadcast of the module's state and the Reducer's bucket
  // all-reduces go to Gloo as they are: a dtype it cannot move fails there
  // with "Invalid scalar type". Refused here, saying what works.
  if (options.process.backend == comm::backend::gloo) {
    std::vector<at::Tensor> state = self.parameters;
    state.insert(state.end(), self.buffers.begin(), self.buffers.end());
    for (const auto& tensor : state) {
      if (comm::gloo_supports(tensor.scalar_type())) continue;
      throw configuration_error(
          std::string("ddp: the module holds ") + c10::toString(tensor.scalar_type()) +
          " tensors, which Gloo cannot broadcast or all-reduce (it moves float32, float64, float16 and integers). "
          "Train with a mixed precision (bf16-mixed keeps float32 parameters), or with fsdp or deepspeed, whose "
          "collectives carry bfloat16 as float32 on Gloo");
    }
  }
  // A group of its own, over every rank of the world.
  std::vector<int> everyone(static_cast<std::size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) everyone[static_cast<std::size_t>(r)] = r;
  self.group = world.new_group(everyone);
  self.native = comm::native_group(*self.group.state());

  // Every rank starts from rank 0's parameters and buffers.
  std::vector<at::Tensor> state = self.parameters;
  state.insert(state.end(), self.buffers.begin(), self.buffers.end());
  {
    at::NoGradGuard no_grad;
    c10d::broadcast_coalesced(self.native, state, broadcast_bucket_bytes, 0);
  }

  const auto bucket_cap = static_cast<std::size_t>(options.bucket_cap_mb * 1024 * 1024);
  const auto first_bucket = static_cast<std::size_t>(options.first_bucket_mb * 1024 * 1024);
  const std::vector<bool> sparse(self.parameters.size(), false);
  auto [bucket_indices, bucket_limits] =
      c10d::compute_bucket_assignment_by_size(self.parameters, {first_bucket, bucket_cap}, sparse);
  std::reverse(bucket_indices.begin(), bucket_indices.end());
  std::reverse(bucket_limits.begin(), bucket_limits.end());
  self.reducer = compat::make_reducer<c10d::Reducer>(
      self.parameters, std::move(bucket_indices), std::move(bucket_limits), self.native, sparse,
      static_cast<int64_t>(bucket_cap), options.find_unused_parameters, options.gradient_as_bucket_view,
      std::move(names), static_cast<int64_t>(first_bucket));
  if (self.group.size() == 2 && options.process.backend == comm::backend::gloo && options.pairwise_exchange) {
    self.reducer->register_comm_hook(std::make_unique<pairwise_exchange_hook>(self.group.state(), &self.exchanges));
    self.uses_exchange = true;
  }
  self.logger = std::make_shared<c10d::Logger>(self.reducer);
  self.reducer->set_logger(self.logger);
  if (options.static_graph) self.reducer->set_static_graph();
}

ddp_engine::~ddp_engine() = default;

void ddp_engine::before_forward() {
  auto& self = *impl_;
  if (self.local) return;
  const bool grad = at::GradMode::is_enabled();
  try {
    if (grad && self.sync) {
      ++self.iterations;
      self.reducer->prepare_for_forward();
    }
    // A collective on the first step after the bucket order was learned;
    // called every step on every rank (the reducer's bookkeeping needs it).
    if (grad) self.reducer->rebuild_buckets();
  } catch (const std::exception& error) {
    const std::string what = without_backtrace(error);
    if (what.find("find_unused_parameters") != std::string::npos) {
      throw configuration_error(
          "ddp: some parameters received no gradient in the previous step, so its gradient reduction never "
          "finished. If the model skips parameters (a branch not taken), enable "
          "loom::ddp_options{.find_unused_parameters = true} (Lightning's strategy "
          "'ddp_find_unused_parameters_true'). c10d said: " + what);
    }
    throw peer_error("ddp: " + what);
  }
  if (self.options.broadcast_buffers && self.forward_param_sync && !self.buffers.empty()) {
    at::NoGradGuard no_grad;
    c10d::broadcast_coalesced(self.native, self.buffers, broadcast_bucket_bytes, 0);
  }
}

void ddp_engine::after_forward(const std::vector<at::Tensor>& outputs) {
  auto& self = *impl_;
  if (self.local) return;
  if (at::GradMode::is_enabled() && self.sync) {
    self.forward_param_sync = true;
    if (self.options.find_unused_parameters && !self.options.static_graph) {
      self.reducer->prepare_for_backward(outputs);
    } else {
      self.reducer->prepare_for_backward({});
    }
  } else {
    self.forward_param_sync = false;
  }
}

bool ddp_engine::sync_enabled() const noexcept { return impl_->sync; }
void ddp_engine::set_sync_enabled(bool enabled) noexcept { impl_->sync = enabled; }
const ddp_options& ddp_engine::options() const noexcept { return impl_->options; }

std::size_t ddp_engine::bucket_count() const {
  if (impl_->local) return 0;
  return impl_->reducer->get_grad_buckets(/*return_zero_tensors=*/true).size();
}

std::uint64_t ddp_engine::collectives_issued() const {
  return impl_->group.collectives_issued() + impl_->exchanges.load(std::memory_order_relaxed);
}

std::uint64_t ddp_engine::collectives_recorded() const { return impl_->group.collectives_recorded(); }

bool ddp_engine::needs_static_graph_sink() const noexcept {
  const auto& self = *impl_;
  return !self.local && self.options.static_graph && self.iterations == 1 && self.sync && at::GradMode::is_enabled();
}

at::Tensor ddp_engine::static_graph_sink(const at::Tensor& output) {
  return delayed_allreduce_sink::apply(output, reinterpret_cast<int64_t>(impl_->reducer.get()));
}

}  // namespace loom::detail
