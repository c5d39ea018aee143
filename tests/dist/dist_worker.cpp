// One program for loom's multi-process tests: run by loom-run, torchrun,
// mpirun or by itself (fabric.launch()), it checks collectives against values
// computed by hand, or plays the part a fault test needs. Exit status 0 means
// every check on this rank passed.
//
//   dist_worker collectives | comm | launch_self N | fork N | allreduce_loop | hang | rendezvous | listen_check
#include "worker_harness.hpp"

#include <loom/environment.hpp>
#include <loom/loom.hpp>
#include <loom/strategy/distributed_runtime.hpp>  // the cluster a rank reports

#include <c10/core/CPUAllocator.h>

#include <torch/nn/modules/linear.h>

#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <algorithm>
#include <atomic>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <sys/resource.h>
#include <unistd.h>
#include <vector>

namespace {

// The harness's one check (worker_harness.hpp); here each message is a plain string.
#define EXPECT(condition, what) LAW_EXPECT(condition, "%s", what)
using laws::failures;
using laws::rank_for_messages;

using laws::seconds_since;

std::chrono::milliseconds timeout_from_env() {
  return std::chrono::milliseconds(loom::cluster::setting_integer("LOOM_TEST_TIMEOUT_MS", 1, 1LL << 40).value_or(60000));
}

// The collectives, each checked against what it must give on W ranks where
// rank r contributes values derived from r.
template <class Fabric>
void check_collectives(Fabric& fabric) {
  const int r = fabric.global_rank();
  const int w = fabric.world_size();
  rank_for_messages = r;
  const double sum_ranks = w * (w - 1) / 2.0;  // 0 + 1 + ... + (w-1)

  // all_reduce for each op and several dtypes.
  for (auto dtype : {at::kFloat, at::kDouble, at::kInt, at::kLong, at::kBFloat16}) {
    const auto mine = at::full({3}, r + 1, dtype);
    const auto sum = fabric.all_reduce(mine, loom::reduce_op::sum);
    EXPECT(sum.scalar_type() == dtype, "all_reduce keeps the dtype");
    EXPECT(torch::equal(sum, at::full({3}, sum_ranks + w, dtype)), "all_reduce sum");
    EXPECT(torch::equal(mine, at::full({3}, r + 1, dtype)), "all_reduce leaves its input alone");
    EXPECT(torch::equal(fabric.all_reduce(mine, loom::reduce_op::min), at::full({3}, 1, dtype)), "all_reduce min");
    EXPECT(torch::equal(fabric.all_reduce(mine, loom::reduce_op::max), at::full({3}, w, dtype)), "all_reduce max");
    double product = 1;
    for (int k = 1; k <= w; ++k) product *= k;
    EXPECT(torch::equal(fabric.all_reduce(mine, loom::reduce_op::product), at::full({3}, product, dtype)),
           "all_reduce product");
    if (at::isFloatingType(dtype)) {
      EXPECT(torch::allclose(fabric.all_reduce(mine, loom::reduce_op::mean).to(at::kDouble),
                             at::full({3}, (sum_ranks + w) / w, at::kDouble)),
             "all_reduce mean");
    } else {
      bool refused = false;
      try {
        fabric.all_reduce(mine, loom::reduce_op::mean);
      } catch (const loom::configuration_error& error) {
        refused = std::string(error.what()).find("floating-point") != std::string::npos;
      }
      EXPECT(refused, "all_reduce mean of an integer tensor is refused");
    }
  }
  // In place, and on a non-contiguous view.
  auto in_place = at::full({2, 4}, r, at::kFloat);
  auto column = in_place.select(1, 1);
  fabric.all_reduce_(column);
  EXPECT(torch::equal(in_place.select(1, 1), at::full({2}, sum_ranks)), "all_reduce_ on a strided view");
  EXPECT(torch::equal(in_place.select(1, 0), at::full({2}, r)), "all_reduce_ touches only the view");

  // Nested containers: a map of vectors, and a tuple.
  std::map<std::string, std::vector<at::Tensor>> nested{{"a", {at::full({1}, r), at::full({2}, 2.0 * r)}},
                                                        {"b", {at::full({1}, 1.0)}}};
  auto reduced = fabric.all_reduce(nested);
  EXPECT(torch::equal(reduced.at("a")[0], at::full({1}, sum_ranks)), "nested all_reduce (map of vectors)");
  EXPECT(torch::equal(reduced.at("a")[1], at::full({2}, 2 * sum_ranks)), "nested all_reduce second tensor");
  EXPECT(torch::equal(reduced.at("b")[0], at::full({1}, static_cast<double>(w))), "nested all_reduce other key");
  auto tuple = fabric.all_reduce(std::make_tuple(at::full({1}, r), 7, at::full({1}, 1.0)), loom::reduce_op::max);
  EXPECT(torch::equal(std::get<0>(tuple), at::full({1}, w - 1.0)) && std::get<1>(tuple) == 7,
         "nested all_reduce (tuple, non-tensors kept)");

  // all_gather: equal shapes, stacked; unequal shapes, one tensor per rank.
  auto stacked = fabric.all_gather(at::full({2}, r));
  EXPECT((stacked.sizes() == at::IntArrayRef{w, 2}), "all_gather shape");
  for (int k = 0; k < w; ++k) EXPECT(torch::equal(stacked[k], at::full({2}, k)), "all_gather values");
  auto uneven = fabric.all_gather_per_rank(at::arange(r + 1, at::kLong).reshape({r + 1, 1}));
  EXPECT(static_cast<int>(uneven.size()) == w, "all_gather_per_rank returns one tensor per rank");
  for (int k = 0; k < w && k < static_cast<int>(uneven.size()); ++k) {
    EXPECT(torch::equal(uneven[static_cast<std::size_t>(k)], at::arange(k + 1, at::kLong).reshape({k + 1, 1})),
           "all_gather_per_rank of unequal shapes");
  }
  auto gathered_nested = fabric.all_gather(std::vector<at::Tensor>{at::full({1}, r), at::full({1}, -r)});
  EXPECT(torch::equal(gathered_nested[1].flatten(), -at::arange(w, at::kFloat)), "nested all_gather");
  bool refused_stack = false;
  try {
    fabric.all_gather(at::zeros({r + 1}));
  } catch (const loom::configuration_error& error) {
    refused_stack = std::string(error.what()).find("equal shapes") != std::string::npos;
  }
  EXPECT(w == 1 || refused_stack, "all_gather refuses unequal shapes, naming the rank");

  // all_gather with sync_grads: the gradient of sum_k (k + 1) * gathered[k]
  // summed over all ranks' losses, reaches each rank's input as W * (r + 1).
  auto input = at::full({2}, static_cast<double>(r)).requires_grad_(true);
  auto gathered = fabric.all_gather(input, /*sync_grads=*/true);
  auto weights = (at::arange(w, at::kDouble) + 1).reshape({w, 1});
  (gathered * weights).sum().backward();
  EXPECT(input.grad().defined() && torch::equal(input.grad(), at::full({2}, static_cast<double>(w * (r + 1)))),
         "all_gather(sync_grads) gradient");

  // broadcast, broadcast_object.
  auto from_last = fabric.broadcast(at::full({3}, 10.0 * r), w - 1);
  EXPECT(torch::equal(from_last, at::full({3}, 10.0 * (w - 1))), "broadcast from the last rank");
  c10::impl::GenericDict object(c10::StringType::get(), c10::AnyType::get());
  object.insert("rank", static_cast<int64_t>(r));
  object.insert("name", std::string("from rank ") + std::to_string(r));
  object.insert("tensor", at::full({2}, r));
  auto received = fabric.broadcast_object(c10::IValue(object), 0).toGenericDict();
  EXPECT(received.at("rank").toInt() == 0 && received.at("name").toStringRef() == "from rank 0" &&
             torch::equal(received.at("tensor").toTensor(), at::zeros({2})),
         "broadcast_object of a dict");
  EXPECT(fabric.broadcast_object(std::string("hello ") + std::to_string(r), 0) == "hello 0",
         "broadcast_object of a string");

  // reduce_scatter: rows r*2 .. r*2+1 of the sum.
  auto rows = at::arange(2 * w, at::kFloat).reshape({2 * w, 1}) * (r + 1);
  auto mine_rows = fabric.reduce_scatter(rows);
  const double factor = sum_ranks + w;
  EXPECT(torch::equal(mine_rows, at::arange(2 * r, 2 * r + 2, at::kFloat).reshape({2, 1}) * factor),
         "reduce_scatter");

  // reduce_boolean_decision.
  EXPECT(fabric.reduce_boolean_decision(true), "reduce_boolean_decision all true");
  EXPECT(fabric.reduce_boolean_decision(r == 0, /*all=*/false), "reduce_boolean_decision any");
  EXPECT(w == 1 || !fabric.reduce_boolean_decision(r == 0, /*all=*/true), "reduce_boolean_decision all, one false");

  // Sub-groups: the even ranks and the odd ranks, then a group of rank 0 alone.
  if (w >= 2) {
    std::vector<int> evens, odds;
    for (int k = 0; k < w; ++k) (k % 2 == 0 ? evens : odds).push_back(k);
    auto even_group = fabric.strategy().new_group(evens);
    auto odd_group = fabric.strategy().new_group(odds);
    auto& my_group = r % 2 == 0 ? even_group : odd_group;
    EXPECT(my_group.valid() && !(r % 2 == 0 ? odd_group : even_group).valid(), "sub-group membership");
    at::Tensor value = at::full({1}, r);
    my_group.all_reduce(value);
    double expected = 0;
    for (int k = r % 2; k < w; k += 2) expected += k;
    EXPECT(torch::equal(value, at::full({1}, expected)), "all_reduce in a sub-group");
    EXPECT(my_group.size() == static_cast<int>((r % 2 == 0 ? evens : odds).size()), "sub-group size");
  }
  fabric.barrier();

  // The sampler shards a dataset by rank.
  auto loader = fabric.setup_dataloaders(
      loom::data::tensor_dataset(at::arange(10, at::kFloat).reshape({10, 1}), at::arange(10)), {.batch_size = 10});
  std::vector<int64_t> seen;
  for (auto& batch : loader) {
    for (int64_t i = 0; i < batch.target.size(0); ++i) seen.push_back(batch.target[i].template item<int64_t>());
  }
  std::vector<int64_t> expected_indices;
  const int per_rank = (10 + w - 1) / w;
  for (int i = 0; i < per_rank; ++i) expected_indices.push_back((r + i * w) % 10);
  EXPECT(seen == expected_indices, "the data loader gives this rank indices r, r + W, ...");
}

template <class Fabric>
int report(Fabric& fabric, const char* what);

// ---------------------------------------------------------------- comm/
// Counts the CPU allocator's allocations, to show the fixed-shape
// collectives allocate no tensor storage per call once warm.
struct counting_allocator final : c10::Allocator {
  c10::Allocator* inner = nullptr;
  mutable std::atomic<long> allocations{0};
  c10::DataPtr allocate(size_t bytes) LOOM_ALLOCATOR_ALLOCATE_CONST override {
    allocations.fetch_add(1, std::memory_order_relaxed);
    return inner->allocate(bytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner->raw_deleter(); }
#if LOOM_ALLOCATOR_NEEDS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { inner->copy_data(dest, src, count); }
#endif
};
counting_allocator cpu_allocations;

template <class F>
bool refused_with(F&& call, const char* needle) {
  try {
    call();
  } catch (const loom::configuration_error& error) {
    return std::string(error.what()).find(needle) != std::string::npos;
  }
  return false;
}

// Bits of a 16-bit float tensor, for bit-exact comparisons (NaN included).
at::Tensor bits(const at::Tensor& tensor) { return tensor.contiguous().view(at::kShort); }

// Every entry point of comm::process_group's fixed-shape and asynchronous
// collectives, for one dtype and one emulation. Rank r contributes small
// integers (exact in bf16 and fp16), so every expectation is exact.
void check_comm_dtype(loom::comm::process_group& group, c10::ScalarType dtype, loom::comm::emulation emulation) {
  const int r = group.rank();
  const int w = group.size();
  group.set_emulation(emulation);
  const std::string what = std::string(c10::toString(dtype)) +
                           (emulation == loom::comm::emulation::alltoall ? " (alltoall)" : " (point-to-point)");
  auto label = [&what](const char* text) { return std::string(text) + ", " + what; };
  const int64_t n = 3;
  const auto options = at::TensorOptions().dtype(dtype);
  auto values_of = [&](int rank) { return (at::arange(n, at::kLong) + 10 * (rank + 1)).to(dtype); };

  // all_gather_into, and in place (the input is the output's own chunk).
  at::Tensor gathered = at::empty({w * n}, options);
  const auto issued = group.collectives_issued();
  group.all_gather_into(gathered, values_of(r)).wait();
  EXPECT(group.collectives_issued() - issued == (w > 1 ? 1u : 0u), label("all_gather_into is one collective").c_str());
  std::vector<at::Tensor> expected_chunks;
  for (int k = 0; k < w; ++k) expected_chunks.push_back(values_of(k));
  const at::Tensor expected_gather = at::cat(expected_chunks);
  EXPECT(torch::equal(gathered, expected_gather), label("all_gather_into").c_str());
  at::Tensor in_place = at::zeros({w * n}, options);
  in_place.narrow(0, r * n, n).copy_(values_of(r));
  group.all_gather_into(in_place, in_place.narrow(0, r * n, n)).wait();
  EXPECT(torch::equal(in_place, expected_gather), label("all_gather_into in place").c_str());

  // reduce_scatter_into: rank r's input is (r + 1) * (1, 2, ..., w n); this
  // rank receives chunk r of the reduction.
  const at::Tensor base = at::arange(1, w * n + 1, at::kLong);
  const at::Tensor input = (base * (r + 1)).to(dtype);
  const at::Tensor mine = base.narrow(0, r * n, n);
  const int64_t rank_sum = w * (w + 1) / 2;
  at::Tensor scattered = at::empty({n}, options);
  const auto issued_scatter = group.collectives_issued();
  group.reduce_scatter_into(scattered, input, loom::reduce_op::sum).wait();
  EXPECT(group.collectives_issued() - issued_scatter == (w > 1 ? 1u : 0u),
         label("reduce_scatter_into is one collective").c_str());
  EXPECT(torch::equal(scattered, (mine * rank_sum).to(dtype)), label("reduce_scatter_into sum").c_str());
  group.reduce_scatter_into(scattered, input, loom::reduce_op::min).wait();
  EXPECT(torch::equal(scattered, mine.to(dtype)), label("reduce_scatter_into min").c_str());
  group.reduce_scatter_into(scattered, input, loom::reduce_op::max).wait();
  EXPECT(torch::equal(scattered, (mine * w).to(dtype)), label("reduce_scatter_into max").c_str());
  if (at::isFloatingType(dtype)) {
    group.reduce_scatter_into(scattered, input, loom::reduce_op::mean).wait();
    EXPECT(torch::allclose(scattered.to(at::kDouble), mine.to(at::kDouble) * rank_sum / w),
           label("reduce_scatter_into mean").c_str());
  } else {
    EXPECT(refused_with([&] { group.reduce_scatter_into(scattered, input, loom::reduce_op::mean).wait(); },
                        "floating-point"),
           label("reduce_scatter_into mean of integers is refused").c_str());
  }
  at::Tensor in_place_input = input.clone();
  at::Tensor own_chunk = in_place_input.narrow(0, r * n, n);
  group.reduce_scatter_into(own_chunk, in_place_input, loom::reduce_op::sum).wait();
  EXPECT(torch::equal(own_chunk, (mine * rank_sum).to(dtype)), label("reduce_scatter_into in place").c_str());

  // Coalesced: two buffers of different sizes under one handle.
  at::Tensor small_out = at::empty({w * 1}, options), large_out = at::empty({w * 5}, options);
  const std::vector<at::Tensor> gather_outs{small_out, large_out};
  const std::vector<at::Tensor> gather_ins{at::full({1}, r + 1, options), at::full({5}, 2 * (r + 1), options)};
  group.all_gather_into(gather_outs, gather_ins).wait();
  EXPECT(torch::equal(small_out, (at::arange(w, at::kLong) + 1).to(dtype)) &&
             torch::equal(large_out, ((at::arange(w, at::kLong) + 1) * 2).repeat_interleave(5).to(dtype)),
         label("all_gather_into coalesced").c_str());
  at::Tensor scatter_a = at::empty({1}, options), scatter_b = at::empty({2}, options);
  const std::vector<at::Tensor> scatter_outs{scatter_a, scatter_b};
  const std::vector<at::Tensor> scatter_ins{at::full({w * 1}, r + 1, options), at::full({w * 2}, 1, options)};
  group.reduce_scatter_into(scatter_outs, scatter_ins, loom::reduce_op::sum).wait();
  EXPECT(torch::equal(scatter_a, at::full({1}, rank_sum, options)) && torch::equal(scatter_b, at::full({2}, w, options)),
         label("reduce_scatter_into coalesced").c_str());

  // all_reduce_async and broadcast_async, in place.
  at::Tensor reduced = at::full({4}, r + 1, options);
  auto pending = group.all_reduce_async(reduced, loom::reduce_op::sum);
  pending.wait();
  EXPECT(torch::equal(reduced, at::full({4}, rank_sum, options)), label("all_reduce_async").c_str());
  at::Tensor broadcasted = at::full({4}, r, options);
  group.broadcast_async(broadcasted, w - 1).wait();
  EXPECT(torch::equal(broadcasted, at::full({4}, w - 1, options)), label("broadcast_async").c_str());

  // Wrong sizes are refused before anything is sent; the group stays usable.
  at::Tensor wrong = at::empty({w * n + 1}, options);
  EXPECT(w == 1 || refused_with([&] { group.all_gather_into(wrong, values_of(r)).wait(); }, "group size"),
         label("all_gather_into refuses a wrong output size").c_str());
  EXPECT(refused_with([&] { group.reduce_scatter_into(at::empty({n}, at::kDouble), input).wait(); }, "dtype"),
         label("reduce_scatter_into refuses mixed dtypes").c_str());
  group.all_gather_into(gathered, values_of(r)).wait();
  EXPECT(torch::equal(gathered, expected_gather), label("the group works after refused calls").c_str());
}

// Each thread's nice value, by thread id (Linux: getpriority of a thread id
// is that thread's own).
std::map<pid_t, int> thread_nice_values() {
  std::map<pid_t, int> nice_of;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    const auto thread = static_cast<pid_t>(std::stol(task.path().filename().string()));
    errno = 0;  // -1 is a nice value as well as the error return
    const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(thread));
    if (errno == 0) nice_of[thread] = nice;  // else the thread ended meanwhile
  }
  return nice_of;
}

// Gloo's event loop runs 10 nicer than the rank (process_group.cpp: it
// spins while a collective holds a pair's lock); every other thread,
// the collectives' included, at the rank's own nice.
void check_gloo_event_loop_nice() {
  const auto nice_of = thread_nice_values();
  const int own = nice_of.at(::gettid());
  const int loop = std::min(own + 10, 19);
  int at_loop = 0, elsewhere = 0;
  for (const auto& [thread, nice] : nice_of) {
    if (nice == loop && nice != own) ++at_loop;
    else if (nice != own) ++elsewhere;
  }
  EXPECT(own == 19 || (at_loop >= 1 && elsewhere == 0),
         "Gloo's event loop runs at the rank's nice + 10, every other thread at the rank's");
  if (rank_for_messages == 0) {
    std::printf("nice: the rank's threads at %d, %d at %d (Gloo's event loop)\n", own, at_loop, loop);
  }
}

int run_comm() {
  cpu_allocations.inner = c10::GetDefaultCPUAllocator();
  c10::SetCPUAllocator(&cpu_allocations, /*priority=*/100);
  loom::Fabric<loom::cpu, loom::parallel> fabric({}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  auto& group = fabric.strategy().group();
  const int r = group.rank();
  const int w = group.size();
  rank_for_messages = r;
  check_gloo_event_loop_nice();
  EXPECT(group.capabilities().name == "gloo" && !group.capabilities().reduce_scatter &&
             !group.capabilities().bf16_collectives,
         "Gloo's row of the capability table");
  for (auto emulation : {loom::comm::emulation::point_to_point, loom::comm::emulation::alltoall}) {
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kLong}) check_comm_dtype(group, dtype, emulation);
  }
  group.set_emulation(loom::comm::emulation::point_to_point);

  // bf16 moves bit-exact (as a float16 view): NaN, infinities and -0.
  const at::Tensor special =
      at::tensor({std::nan(""), INFINITY, -INFINITY, -0.0, 1.0 + r / 128.0}, at::kFloat).to(at::kBFloat16);
  at::Tensor special_out = at::empty({w * 5}, at::kBFloat16);
  group.all_gather_into(special_out, special).wait();
  EXPECT(torch::equal(bits(special_out.narrow(0, r * 5, 5)), bits(special)) &&
             torch::equal(bits(special_out.narrow(0, 0, 4)), bits(special.narrow(0, 0, 4))),
         "bf16 all_gather_into is bit-exact (NaN, Inf, -0)");
  at::Tensor special_broadcast = special.clone();
  group.broadcast_async(special_broadcast, 0).wait();
  EXPECT(torch::equal(bits(special_broadcast.narrow(0, 0, 4)), bits(special.narrow(0, 0, 4))),
         "bf16 broadcast is bit-exact");

  // bf16 reductions accumulate in fp32 and round once: w copies of
  // 1 + 2^-8 sum to w + w 2^-8, which bf16 rounds once; summing in bf16
  // would lose the small part at every step.
  const at::Tensor fine = at::full({w}, 1.0 + 1.0 / 256, at::kFloat);
  at::Tensor fine_out = at::empty({1}, at::kBFloat16);
  group.reduce_scatter_into(fine_out, fine.to(at::kBFloat16), loom::reduce_op::sum).wait();
  EXPECT(torch::equal(fine_out, fine.to(at::kBFloat16).to(at::kFloat).narrow(0, 0, 1).mul(w).to(at::kBFloat16)),
         "bf16 reduce_scatter_into sums in fp32 and rounds once");

  // No tensor storage per call once warm (point-to-point emulation).
  at::Tensor warm_out = at::empty({w * 1024}), warm_in = at::ones({1024}), warm_rs = at::empty({1024});
  at::Tensor warm_rs_in = at::ones({w * 1024});
  for (int round = 0; round < 2; ++round) {
    group.all_gather_into(warm_out, warm_in).wait();
    group.reduce_scatter_into(warm_rs, warm_rs_in).wait();
  }
  const long before = cpu_allocations.allocations.load();
  for (int round = 0; round < 10; ++round) {
    group.all_gather_into(warm_out, warm_in).wait();
    group.reduce_scatter_into(warm_rs, warm_rs_in).wait();
  }
  const long allocated = cpu_allocations.allocations.load() - before;
  EXPECT(allocated == 0, "all_gather_into / reduce_scatter_into allocate no tensor storage once warm");
  if (r == 0) std::printf("comm: %ld tensor allocations in 20 warm fixed-shape collectives\n", allocated);

  // Two outstanding handles: on one group, waited in reverse order; and on
  // the two dimensions of a mesh, waited in reverse order.
  at::Tensor first = at::empty({w}), second = at::empty({w});
  auto first_handle = group.all_gather_into(first, at::full({1}, r, at::kFloat));
  auto second_handle = group.all_gather_into(second, at::full({1}, 2 * r, at::kFloat));
  second_handle.wait();
  first_handle.wait();
  EXPECT(torch::equal(first, at::arange(w, at::kFloat)) && torch::equal(second, at::arange(w, at::kFloat) * 2),
         "two handles on one group, waited in reverse order");
  const int outer = w % 2 == 0 ? w / 2 : w;
  const int inner = w / outer;
  loom::comm::device_mesh mesh(group, {outer, inner}, {"data_parallel", "tensor_parallel"});
  EXPECT(mesh.coordinate("data_parallel") == r / inner && mesh.coordinate("tensor_parallel") == r % inner &&
             mesh.size("data_parallel") == outer && mesh.size("tensor_parallel") == inner,
         "mesh coordinates are row-major");
  auto& dp = mesh.group("data_parallel");
  auto& tp = mesh.group("tensor_parallel");
  EXPECT(dp.size() == outer && tp.size() == inner, "mesh sub-group sizes");
  at::Tensor dp_out = at::empty({outer});
  at::Tensor tp_out = at::empty({1});
  auto dp_handle = dp.all_gather_into(dp_out, at::full({1}, r, at::kFloat));
  auto tp_handle = tp.reduce_scatter_into(tp_out, at::full({inner}, r, at::kFloat), loom::reduce_op::sum);
  tp_handle.wait();
  dp_handle.wait();
  at::Tensor dp_expected = at::arange(outer, at::kFloat) * inner + r % inner;
  const double tp_expected = inner * (r / inner) * inner + inner * (inner - 1) / 2.0;
  EXPECT(torch::equal(dp_out, dp_expected), "all_gather_into on the data_parallel dimension");
  EXPECT(torch::equal(tp_out, at::full({1}, tp_expected)), "reduce_scatter_into on the tensor_parallel dimension");
  EXPECT(refused_with([&] { (void)mesh.group("pipeline"); }, "data_parallel, tensor_parallel"),
         "an unknown mesh dimension lists the known ones");
  EXPECT(refused_with([&] { loom::comm::device_mesh(group, {w, 2}, {"a", "b"}); }, "multiply to the world size"),
         "a mesh that does not cover the world is refused");

  // Autograd-aware collectives: forward values and the transposed collective
  // in backward. Upstream gradients are (r + 1) everywhere, from
  // loss = sum((r + 1) * y), so a sum over ranks of them is rank_sum.
  const double rank_sum = w * (w + 1) / 2.0;
  auto upstream = [&](const at::Tensor& y) { (y * (r + 1.0)).sum().backward(); };
  {
    at::Tensor x = at::full({2, 3}, r + 1.0).requires_grad_(true);
    at::Tensor y = loom::comm::copy_to_group(group, x);
    EXPECT(torch::equal(y, x), "copy_to_group forward is the identity");
    upstream(y);
    EXPECT(torch::equal(x.grad(), at::full({2, 3}, rank_sum)), "copy_to_group backward all-reduces");
  }
  {
    at::Tensor x = at::full({2, 3}, r + 1.0).requires_grad_(true);
    at::Tensor y = loom::comm::all_reduce_with_grad(group, x);
    EXPECT(torch::equal(y, at::full({2, 3}, rank_sum)), "all_reduce_with_grad forward sums");
    upstream(y);
    EXPECT(torch::equal(x.grad(), at::full({2, 3}, r + 1.0)), "all_reduce_with_grad backward is the identity");
  }
  for (auto gradient : {loom::comm::gathered_gradient::partial, loom::comm::gathered_gradient::replicated}) {
    at::Tensor x = at::full({2, 3}, r + 1.0).requires_grad_(true);
    at::Tensor y = loom::comm::all_gather_with_grad(group, x, /*dim=*/-1, gradient);
    EXPECT((y.sizes() == at::IntArrayRef{2, 3 * w}), "all_gather_with_grad shape");
    bool values = true;
    for (int k = 0; k < w; ++k) values = values && torch::equal(y.narrow(1, 3 * k, 3), at::full({2, 3}, k + 1.0));
    EXPECT(values, "all_gather_with_grad lays the ranks' chunks along the dimension");
    upstream(y);
    const double expected = gradient == loom::comm::gathered_gradient::partial ? rank_sum : r + 1.0;
    EXPECT(torch::equal(x.grad(), at::full({2, 3}, expected)),
           "all_gather_with_grad backward: reduce-scatter (partial) or own slice (replicated)");
  }
  {
    at::Tensor x = at::full({2, 2 * w}, r + 1.0).requires_grad_(true);
    at::Tensor y = loom::comm::reduce_scatter_with_grad(group, x, /*dim=*/1);
    EXPECT(torch::equal(y, at::full({2, 2}, rank_sum)), "reduce_scatter_with_grad forward");
    upstream(y);
    bool gathered = true;
    for (int k = 0; k < w; ++k) gathered = gathered && torch::equal(x.grad().narrow(1, 2 * k, 2), at::full({2, 2}, k + 1.0));
    EXPECT(gathered, "reduce_scatter_with_grad backward all-gathers");
  }
  {
    at::Tensor x = (at::arange(2 * w, at::kFloat) * 1.0).reshape({1, 2 * w}).requires_grad_(true);
    at::Tensor y = loom::comm::scatter_to_group(group, x, /*dim=*/1);
    EXPECT(torch::equal(y, at::arange(2 * r, 2 * r + 2, at::kFloat).reshape({1, 2})), "scatter_to_group keeps this rank's chunk");
    upstream(y);
    bool gathered = true;
    for (int k = 0; k < w; ++k) gathered = gathered && torch::equal(x.grad().narrow(1, 2 * k, 2), at::full({1, 2}, k + 1.0));
    EXPECT(gathered, "scatter_to_group backward all-gathers");
  }
  EXPECT(refused_with([&] { (void)loom::comm::reduce_scatter_with_grad(group, at::ones({2, 2 * w + 1}), 1); },
                      "not a multiple of the group size") || w == 1,
         "reduce_scatter_with_grad refuses a dimension the group does not divide");
  return report(fabric, "comm");
}

template <class Fabric>
int report(Fabric& fabric, const char* what) {
  const bool everyone = fabric.reduce_boolean_decision(failures == 0, /*all=*/true);
  if (fabric.is_global_zero()) {
    std::printf("%s: world_size=%d %s\n", what, fabric.world_size(), everyone ? "all checks passed" : "FAILED");
  }
  return failures == 0 ? 0 : 1;
}

// LOOM_TEST_BACKEND=mpi: the collectives on loom's MPI group (tests/dist/mpi.sh).
loom::comm::backend backend_from_env() {
  return loom::cluster::setting_text("LOOM_TEST_BACKEND") == "mpi" ? loom::comm::backend::mpi : loom::comm::backend::gloo;
}

int run_collectives() {
  loom::Fabric<loom::cpu, loom::parallel> fabric(
      {}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env(), .backend = backend_from_env()}));
  fabric.launch();
  std::printf("rank %d/%d local %d node %d (%s environment)\n", fabric.global_rank(), fabric.world_size(),
              fabric.local_rank(), fabric.node_rank(), fabric.strategy().runtime().cluster().name.c_str());
  check_collectives(fabric);
  return report(fabric, "collectives");
}

int run_launch_self(int devices) {
  loom::Fabric<loom::cpu, loom::parallel> fabric({.devices = devices},
                                                 loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  check_collectives(fabric);
  return report(fabric, "launch_self");
}

int run_fork(int devices) {
  loom::Fabric<loom::cpu, loom::parallel> fabric(
      {.devices = devices},
      loom::parallel(loom::parallel_options{.timeout = timeout_from_env(), .launcher = loom::launcher_kind::fork}));
  return fabric.launch([](auto& f) {
    check_collectives(f);
    return report(f, "fork");
  });
}

// All-reduces until something fails; with LOOM_TEST_KILL_RANK=k, rank k
// kills itself (SIGKILL) in the middle of the loop. Survivors print how long
// the failure took to surface and what it said, and exit with status 3.
int run_allreduce_loop() {
  loom::Fabric<loom::cpu, loom::parallel> fabric({}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  const int kill_rank = static_cast<int>(loom::cluster::setting_integer("LOOM_TEST_KILL_RANK", 0, 1 << 20).value_or(-1));
  at::Tensor tensor = at::ones({1 << 16});
  auto killed_at = std::chrono::steady_clock::now();
  for (int iteration = 0;; ++iteration) {
    if (iteration == 200 && fabric.global_rank() == kill_rank) {
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
    if (iteration == 200) killed_at = std::chrono::steady_clock::now();
    try {
      fabric.all_reduce_(tensor);
    } catch (const loom::peer_error& error) {
      std::printf("rank %d caught after %.3f s: %s\n", fabric.global_rank(), seconds_since(killed_at), error.what());
      std::fflush(stdout);
      // The group is unusable now: every later collective fails at once.
      try {
        fabric.barrier();
      } catch (const loom::peer_error& again) {
        std::printf("rank %d: next call failed at once: %s\n", fabric.global_rank(),
                    std::string(again.what()).substr(0, 60).c_str());
      }
      return 3;
    }
    tensor.fill_(1.0);
    if (iteration > 200000) return 0;
  }
}

// fabric.launch() started the ranks itself; the last one kills itself. The
// others keep sleeping in their failure handler, so what ends the job is
// rank 0's watch over the ranks it started (it exits with the dead rank's
// status, after ending the others).
int run_launch_kill(int devices) {
  loom::Fabric<loom::cpu, loom::parallel> fabric({.devices = devices},
                                                 loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  at::Tensor tensor = at::ones({8});
  for (int iteration = 0; iteration < 100000; ++iteration) {
    if (iteration == 50 && fabric.global_rank() == devices - 1) ::raise(SIGKILL);
    try {
      fabric.all_reduce_(tensor);
    } catch (const loom::peer_error&) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 3;
    }
    tensor.fill_(1.0);
  }
  return 0;
}

// A rank that stops taking part: rank 1 sleeps; the others time out.
int run_hang() {
  loom::Fabric<loom::cpu, loom::parallel> fabric({}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  if (fabric.global_rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    at::Tensor t = at::ones({4});
    fabric.all_reduce_(t);
  } catch (const loom::peer_error& error) {
    std::printf("rank %d timed out after %.3f s: %s\n", fabric.global_rank(), seconds_since(start), error.what());
    return 3;
  }
  return 0;
}

// Only the rendezvous (for the TCPStore error tests).
int run_rendezvous() {
  const auto start = std::chrono::steady_clock::now();
  try {
    loom::Fabric<loom::cpu, loom::parallel> fabric(
        {}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
    fabric.launch();
    fabric.barrier();
    std::printf("rank %d: rendezvous done\n", fabric.global_rank());
    return 0;
  } catch (const std::exception& error) {
    std::printf("rendezvous failed after %.3f s: %s\n", seconds_since(start), error.what());
    return 3;
  }
}

// Stays in the job for a while so a test can look at its sockets.
int run_listen_check() {
  loom::Fabric<loom::cpu, loom::parallel> fabric({}, loom::parallel(loom::parallel_options{.timeout = timeout_from_env()}));
  fabric.launch();
  at::Tensor t = at::ones({4});
  fabric.all_reduce_(t);
  std::printf("rank %d pid %d ready\n", fabric.global_rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  fabric.barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "collectives";
  const int devices = argc > 2 ? std::atoi(argv[2]) : 2;
  try {
    if (scenario == "collectives") return run_collectives();
    if (scenario == "comm") return run_comm();
    if (scenario == "launch_self") return run_launch_self(devices);
    if (scenario == "fork") return run_fork(devices);
    if (scenario == "launch_kill") return run_launch_kill(devices);
    if (scenario == "allreduce_loop") return run_allreduce_loop();
    if (scenario == "hang") return run_hang();
    if (scenario == "rendezvous") return run_rendezvous();
    if (scenario == "listen_check") return run_listen_check();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dist_worker %s: %s\n", scenario.c_str(), error.what());
    return 1;
  }
  std::fprintf(stderr, "dist_worker: unknown scenario '%s'\n", scenario.c_str());
  return 2;
}
