// loom's asynchronous collectives over c10d: all_reduce, broadcast and the
// fixed-shape all_gather_into / reduce_scatter_into that sharding needs,
// native where the backend has them (capabilities.hpp), and built from
// point-to-point messages or alltoall_base where it does not (Gloo).
#include "process_group_state.hpp"

#include <loom/comm/process_group.hpp>
#include <loom/comm/work.hpp>
#include <loom/errors.hpp>

#include <ATen/ATen.h>

#include <string>
#include <utility>

namespace loom::comm {

struct work_access {
  static work make(std::shared_ptr<process_group_state> group, work_slot* slot) noexcept {
    return work(std::move(group), slot);
  }
};

namespace {

// Point-to-point slots of the emulated collectives (apart from the DDP
// exchange hook's): messages of one slot between two ranks match in the
// order they were posted, which is the program order every rank shares.
constexpr int all_gather_tag = 0x20;
constexpr int reduce_scatter_tag = 0x21;

work_slot* acquire(process_group_state& state, const char* operation) {
  std::lock_guard<std::mutex> lock(state.slots_mutex);
  work_slot* slot = nullptr;
  if (state.free_slots.empty()) {
    state.slots.push_back(std::make_unique<work_slot>());
    slot = state.slots.back().get();
    state.free_slots.reserve(state.slots.size());
  } else {
    slot = state.free_slots.back();
    state.free_slots.pop_back();
  }
  slot->operation = operation;
  return slot;
}

// Drops every reference to the caller's tensors; scratch buffers stay.
void release(process_group_state& state, work_slot* slot) noexcept {
  for (; slot->timed_collectives > 0; --slot->timed_collectives) collective_completed();
  slot->pending.clear();
  slot->reductions.clear();
  slot->copies.clear();
  slot->arguments[0] = at::Tensor();
  slot->list_arguments[0].clear();
  std::lock_guard<std::mutex> lock(state.slots_mutex);
  state.free_slots.push_back(slot);
}

// A scratch buffer of the slot with at least numel elements of dtype, kept
// for the next use of the slot.
at::Tensor scratch(work_slot& slot, std::size_t index, int64_t numel, const at::Tensor& like) {
  if (slot.scratch.size() <= index) slot.scratch.resize(index + 1);
  at::Tensor& buffer = slot.scratch[index];
  if (!buffer.defined() || buffer.numel() < numel || buffer.scalar_type() != like.scalar_type() ||
      buffer.device() != like.device()) {
    buffer = at::empty({numel}, like.options());
  }
  return buffer.narrow(0, 0, numel);
}

// bf16 as Gloo moves it: the same bytes viewed as float16 (bit-exact, NaN,
// Inf and -0 included); Gloo refuses bf16 in collectives, int16 too.
at::Tensor on_wire(const process_group_state& state, const at::Tensor& tensor) {
  if (tensor.scalar_type() == at::kBFloat16 && !capabilities_of(state.kind).bf16_collectives) {
    return tensor.view(at::kHalf);
  }
  return tensor;
}

c10d::ReduceOp native_op(reduce_op op, bool native_mean) {
  switch (op) {
    case reduce_op::sum: return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case reduce_op::mean: return c10d::ReduceOp(native_mean ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM);
    case reduce_op::min: return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case reduce_op::max: return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case reduce_op::product: return c10d::ReduceOp(c10d::ReduceOp::PRODUCT);
  }
  return c10d::ReduceOp(c10d::ReduceOp::SUM);
}

std::string describe(const at::Tensor& tensor) {
  std::string text = std::string(c10::toString(tensor.scalar_type())) + "[";
  for (int64_t d = 0; d < tensor.dim(); ++d) text += (d ? ", " : "") + std::to_string(tensor.size(d));
  return text + "]";
}

// Refuses, before anything is sent (a failed collective can poison a Gloo
// group), what the fixed-shape forms cannot take.
void validate_pair(const process_group_state& state, const char* operation, const at::Tensor& out,
                   const at::Tensor& in, int64_t out_numel_expected, int64_t in_numel_expected) {
  const std::string name(operation);
  if (!out.defined() || !in.defined()) throw configuration_error(name + ": both buffers must be defined tensors");
  if (out.scalar_type() != in.scalar_type() || out.device() != in.device()) {
    throw configuration_error(name + ": out is " + describe(out) + " on " + out.device().str() + ", in is " +
                              describe(in) + " on " + in.device().str() + "; both must have one dtype and device");
  }
  check_on_device(state, in, operation);
  if (!out.is_contiguous() || !in.is_contiguous()) {
    throw configuration_error(name + ": out and in must be contiguous (these forms fill the caller's buffers "
                                     "without copies); call .contiguous() once, outside the loop");
  }
  if (out.numel() != out_numel_expected || in.numel() != in_numel_expected) {
    throw configuration_error(name + ": out is " + describe(out) + " and in " + describe(in) + " on a group of " +
                              std::to_string(state.size) +
                              "; out must hold group size x in's elements (all_gather_into) or in group size x "
                              "out's (reduce_scatter_into)");
  }
  if (state.kind == backend::gloo && !gloo_supports(in.scalar_type()) && in.scalar_type() != at::kBFloat16) {
    throw configuration_error(name + ": Gloo cannot move " + std::string(c10::toString(in.scalar_type())) +
                              " tensors; accepted: float, double, half, bfloat16, int8, uint8, int32, int64");
  }
}

// Issues c10d calls into a slot; a synchronous failure releases the slot and
// becomes the peer_error that names the rank.
template <class Body>
work issue(const std::shared_ptr<process_group_state>& group, const char* operation, Body&& body) {
  process_group_state& state = *group;
  check_usable(state, operation);
  work_slot* slot = acquire(state, operation);
  try {
    body(*slot);
  } catch (const std::exception& error) {
    release(state, slot);
    if (dynamic_cast<const configuration_error*>(&error) != nullptr) throw;
    throw failed(state, operation, error);
  }
  return work_access::make(group, slot);
}

void post_all_gather(process_group_state& state, work_slot& slot, const at::Tensor& out, const at::Tensor& in) {
  const int64_t n = in.numel();
  const at::Tensor flat_in = in.view({-1});
  const at::Tensor flat_out = out.view({-1});
  const backend_capabilities caps = capabilities_of(state.kind);
  if (caps.all_gather_into) {
    at::Tensor output = on_wire(state, flat_out);
    at::Tensor input = on_wire(state, flat_in);
    slot.pending.push_back(state.backend->_allgather_base(output, input));
    return;
  }
  at::Tensor own = flat_out.narrow(0, n * state.rank, n);
  if (own.data_ptr() != flat_in.data_ptr()) own.copy_(flat_in);
  if (state.size == 1) return;
  if (state.emulation.load(std::memory_order_relaxed) == emulation::alltoall) {
    // The measured fallback for gathers is Gloo's own list all_gather.
    slot.arguments[0] = on_wire(state, flat_in);
    auto& outputs = slot.list_arguments[0];
    for (int k = 0; k < state.size; ++k) outputs.push_back(on_wire(state, flat_out.narrow(0, n * k, n)));
    c10d::AllgatherOptions options;
    options.timeout = state.options.timeout;
    slot.pending.push_back(state.backend->allgather(slot.list_arguments, slot.arguments, options));
    outputs.clear();
    return;
  }
  slot.timed_collectives += record_emulated(state, collective_kind::all_gather, flat_in);
  const at::Tensor wire_in = on_wire(state, flat_in);
  for (int step = 1; step < state.size; ++step) {
    const int peer = (state.rank + step) % state.size;
    slot.arguments[0] = wire_in;
    slot.pending.push_back(state.backend->send(slot.arguments, peer, all_gather_tag));
    slot.arguments[0] = on_wire(state, flat_out.narrow(0, n * peer, n));
    slot.pending.push_back(state.backend->recv(slot.arguments, peer, all_gather_tag));
  }
}

void post_reduce_scatter(process_group_state& state, work_slot& slot, std::size_t index, const at::Tensor& out,
                         const at::Tensor& in, reduce_op op) {
  const int64_t n = out.numel();
  const at::Tensor flat_in = in.view({-1});
  const at::Tensor flat_out = out.view({-1});
  const backend_capabilities caps = capabilities_of(state.kind);
  if (caps.reduce_scatter && (op != reduce_op::mean || caps.mean)) {
    at::Tensor output = on_wire(state, flat_out);
    at::Tensor input = on_wire(state, flat_in);
    c10d::ReduceScatterOptions options;
    options.reduceOp = native_op(op, caps.mean);
    options.timeout = state.options.timeout;
    slot.pending.push_back(state.backend->_reduce_scatter_base(output, input, options));
    return;
  }
  const at::Tensor own = flat_in.narrow(0, n * state.rank, n);
  const bool alltoall = state.emulation.load(std::memory_order_relaxed) == emulation::alltoall;
  const bool widen = flat_out.scalar_type() == at::kBFloat16 || flat_out.scalar_type() == at::kHalf;
  if (state.size == 2 && !alltoall && !widen) {
    // Two ranks: the peer's chunk arrives in out itself and own is added to
    // it (a + b == b + a exactly), so no buffer of the chunk's size is
    // needed; where out is own (ZeRO-1's gradient buffer reduces into its own
    // chunk), it arrives in one chunk of scratch and is added to out.
    const bool aliased = flat_out.data_ptr() == own.data_ptr();
    const at::Tensor arrives = aliased ? scratch(slot, index, n, flat_in) : flat_out;
    slot.reductions.push_back({flat_out, aliased ? arrives : own, -1, op});
    slot.timed_collectives += record_emulated(state, collective_kind::reduce_scatter, flat_out);
    const int peer = 1 - state.rank;
    slot.arguments[0] = flat_in.narrow(0, n * peer, n);
    slot.pending.push_back(state.backend->send(slot.arguments, peer, reduce_scatter_tag));
    slot.arguments[0] = arrives;
    slot.pending.push_back(state.backend->recv(slot.arguments, peer, reduce_scatter_tag));
    return;
  }
  const at::Tensor received = scratch(slot, index, n * state.size, flat_in);
  slot.reductions.push_back({flat_out, own, static_cast<int64_t>(index), op});
  if (state.size == 1) return;
  if (alltoall) {
    at::Tensor output = on_wire(state, received);
    at::Tensor input = on_wire(state, flat_in);
    std::vector<int64_t> equal_splits;  // empty: equal splits
    c10d::AllToAllOptions options;
    options.timeout = state.options.timeout;
    slot.pending.push_back(state.backend->alltoall_base(output, input, equal_splits, equal_splits, options));
    return;
  }
  slot.timed_collectives += record_emulated(state, collective_kind::reduce_scatter, flat_out);
  for (int step = 1; step < state.size; ++step) {
    const int peer = (state.rank + step) % state.size;
    slot.arguments[0] = on_wire(state, flat_in.narrow(0, n * peer, n));
    slot.pending.push_back(state.backend->send(slot.arguments, peer, reduce_scatter_tag));
    slot.arguments[0] = on_wire(state, received.narrow(0, n * peer, n));
    slot.pending.push_back(state.backend->recv(slot.arguments, peer, reduce_scatter_tag));
  }
}

void combine(at::Tensor& accumulator, const at::Tensor& chunk, reduce_op op) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::mean: accumulator.add_(chunk); break;
    case reduce_op::product: accumulator.mul_(chunk); break;
    case reduce_op::min: at::minimum_out(accumulator, accumulator, chunk); break;
    case reduce_op::max: at::maximum_out(accumulator, accumulator, chunk); break;
  }
}

// The local step of an emulated reduce-scatter: every rank's chunk, in rank
// order, into out; 16-bit floats accumulate in fp32 and round once.
void reduce_chunks(const process_group_state& state, work_slot& slot, const work_slot::reduction& entry) {
  const int64_t n = entry.out.numel();
  if (entry.received < 0) {
    at::Tensor out = entry.out;  // holds one of the two chunks, entry.own the other
    combine(out, entry.own, entry.op);
    if (entry.op == reduce_op::mean) out.div_(state.size);
    return;
  }
  const at::Tensor received = slot.scratch[static_cast<std::size_t>(entry.received)];
  auto chunk_of = [&](int k) { return k == state.rank ? entry.own : received.narrow(0, n * k, n); };
  const bool widen = entry.out.scalar_type() == at::kBFloat16 || entry.out.scalar_type() == at::kHalf;
  const bool aliased = entry.out.data_ptr() == entry.own.data_ptr();
  at::Tensor accumulator = entry.out;
  if (widen || aliased) {
    const auto dtype = widen ? at::kFloat : entry.out.scalar_type();
    if (!slot.accumulator.defined() || slot.accumulator.numel() < n || slot.accumulator.scalar_type() != dtype) {
      slot.accumulator = at::empty({n}, entry.out.options().dtype(dtype));
    }
    accumulator = slot.accumulator.narrow(0, 0, n);
  }
  accumulator.copy_(chunk_of(0));
  for (int k = 1; k < state.size; ++k) combine(accumulator, chunk_of(k), entry.op);
  if (entry.op == reduce_op::mean) accumulator.div_(state.size);
  if (!accumulator.is_same(entry.out)) entry.out.copy_(accumulator);
}

void finish(const process_group_state& state, work_slot& slot) {
  for (const auto& entry : slot.reductions) reduce_chunks(state, slot, entry);
  for (auto& entry : slot.copies) {
    if (entry.divide) entry.wire.div_(state.size);
    if (!entry.wire.is_same(entry.target)) entry.target.copy_(entry.wire);
  }
}

// The checks both fixed-shape forms share: one output per input, and on a
// single process (no group) each output is a copy of its input.
bool pair_up_or_copy(const char* operation, std::span<const at::Tensor> outs, std::span<const at::Tensor> ins,
                     bool has_group) {
  if (outs.size() != ins.size()) {
    throw configuration_error(std::string(operation) + ": " + std::to_string(outs.size()) + " outputs for " +
                              std::to_string(ins.size()) + " inputs");
  }
  if (has_group) return false;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].numel() != ins[i].numel()) {
      throw configuration_error(std::string(operation) + ": out " + describe(outs[i]) + " must hold in's " +
                                std::to_string(ins[i].numel()) + " elements on one process");
    }
    if (outs[i].data_ptr() != ins[i].data_ptr()) outs[i].view({-1}).copy_(ins[i].reshape({-1}));
  }
  return true;
}

}  // namespace

void work::wait() {
  if (slot_ == nullptr) return;
  work_slot* slot = std::exchange(slot_, nullptr);
  const std::shared_ptr<process_group_state> group = std::move(group_);
  process_group_state& state = *group;
  const char* operation = slot->operation;
  try {
    for (auto& pending : slot->pending) pending->wait();
    finish(state, *slot);
  } catch (const std::exception& error) {
    release(state, slot);
    if (dynamic_cast<const peer_error*>(&error) != nullptr) throw;
    throw failed(state, operation, error);
  }
  release(state, slot);
}

void work::finish_quietly() noexcept {
  try {
    wait();
  } catch (...) {
    // The group is marked broken; its next call reports why.
  }
}

work process_group::all_gather_into(const at::Tensor& out, const at::Tensor& in) {
  return all_gather_into(std::span<const at::Tensor>(&out, 1), std::span<const at::Tensor>(&in, 1));
}

work process_group::reduce_scatter_into(const at::Tensor& out, const at::Tensor& in, reduce_op op) {
  return reduce_scatter_into(std::span<const at::Tensor>(&out, 1), std::span<const at::Tensor>(&in, 1), op);
}

work process_group::all_gather_into(std::span<const at::Tensor> outs, std::span<const at::Tensor> ins) {
  if (pair_up_or_copy("all_gather_into", outs, ins, state_ != nullptr)) return {};
  const int world = size();
  for (std::size_t i = 0; i < outs.size(); ++i) {
    validate_pair(*state_, "all_gather_into", outs[i], ins[i], ins[i].numel() * world, ins[i].numel());
  }
  return issue(state_, "all_gather_into", [&](work_slot& slot) {
    for (std::size_t i = 0; i < outs.size(); ++i) post_all_gather(*state_, slot, outs[i], ins[i]);
  });
}

work process_group::reduce_scatter_into(std::span<const at::Tensor> outs, std::span<const at::Tensor> ins,
                                        reduce_op op) {
  for (const auto& in : ins) check_mean_dtype(in, op);
  if (pair_up_or_copy("reduce_scatter_into", outs, ins, state_ != nullptr)) return {};
  const int world = size();
  for (std::size_t i = 0; i < outs.size(); ++i) {
    validate_pair(*state_, "reduce_scatter_into", outs[i], ins[i], outs[i].numel(), outs[i].numel() * world);
  }
  return issue(state_, "reduce_scatter_into", [&](work_slot& slot) {
    for (std::size_t i = 0; i < outs.size(); ++i) post_reduce_scatter(*state_, slot, i, outs[i], ins[i], op);
  });
}

void process_group::release_buffers() {
  if (!state_) return;
  std::lock_guard<std::mutex> lock(state_->slots_mutex);
  for (work_slot* slot : state_->free_slots) {
    slot->scratch.clear();
    slot->accumulator = at::Tensor();
  }
}

work process_group::all_reduce_async(const at::Tensor& tensor, reduce_op op) {
  check_mean_dtype(tensor, op);
  if (!state_) return {};
  return issue(state_, "all_reduce", [&](work_slot& slot) {
    const bool native_mean = capabilities_of(state_->kind).mean;
    at::Tensor wire = wire_tensor(*state_, tensor, "all_reduce");
    slot.arguments[0] = wire;
    c10d::AllreduceOptions options;
    options.reduceOp = native_op(op, native_mean);
    options.timeout = state_->options.timeout;
    slot.pending.push_back(state_->backend->allreduce(slot.arguments, options));
    const bool divide = op == reduce_op::mean && !native_mean;
    if (divide || !wire.is_same(tensor)) slot.copies.push_back({tensor, std::move(wire), divide});
  });
}

work process_group::broadcast_async(const at::Tensor& tensor, int source) {
  if (!state_) return {};
  if (source < 0 || source >= state_->size) {
    throw configuration_error("broadcast: source rank " + std::to_string(source) + " is not in a group of " +
                              std::to_string(state_->size));
  }
  return issue(state_, "broadcast", [&](work_slot& slot) {
    // bf16 moves as its float16 view (no copy); other dtypes as all_reduce takes them.
    check_on_device(*state_, tensor, "broadcast");
    at::Tensor wire = tensor.scalar_type() == at::kBFloat16 && tensor.is_contiguous()
                          ? on_wire(*state_, tensor)
                          : wire_tensor(*state_, tensor, "broadcast");
    slot.arguments[0] = wire;
    c10d::BroadcastOptions options;
    options.rootRank = source;
    options.timeout = state_->options.timeout;
    slot.pending.push_back(state_->backend->broadcast(slot.arguments, options));
    if (wire.data_ptr() != tensor.data_ptr()) slot.copies.push_back({tensor, std::move(wire), false});
  });
}

void process_group::all_reduce(at::Tensor& tensor, reduce_op op) { all_reduce_async(tensor, op).wait(); }

void process_group::broadcast(at::Tensor& tensor, int source) { broadcast_async(tensor, source).wait(); }

at::Tensor process_group::reduce_scatter(const at::Tensor& input, reduce_op op) {
  check_mean_dtype(input, op);
  const int world = size();
  if (input.dim() == 0 || input.size(0) % world != 0) {
    throw configuration_error("reduce_scatter: the input's first dimension (" +
                              std::to_string(input.dim() ? input.size(0) : 0) +
                              ") must be a multiple of the group size " + std::to_string(world));
  }
  const int64_t rows = input.size(0) / world;
  if (!state_) return input.clone();
  at::Tensor output = at::empty_like(input.narrow(0, 0, rows), at::MemoryFormat::Contiguous);
  reduce_scatter_into(output, input.contiguous(), op).wait();
  return output;
}

}  // namespace loom::comm
