// loom's MPI process group (src/comm/mpi_backend.hpp) under mpirun, on 2
// and 4 ranks (tests/dist/mpi.sh): every collective c10d defines, with
// float, double, int64, bf16 and fp16, every reduction (sum, avg, product,
// min, max, the bitwise ones), non-contiguous tensors, several operations
// in flight waited in reverse order, point to point (and any source), on
// MPI_COMM_WORLD and on a split of it; large all-reduces through loom's
// shared memory (or, with LOOM_MPI_SHARED_MEMORY=0, MPI's calls in pieces),
// and a late rank named by the shared-memory wait's timeout; and what is
// refused says why.
#include "../../src/comm/mpi_backend.hpp"

#include "worker_harness.hpp"

#include <loom/environment.hpp>
#include <loom/errors.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

int world_rank = 0;
using laws::failures;

using loom::comm::mpi_backend;

// Rank r's values: r + 1 + i / 8 (exact in bf16 and fp16 for these sizes).
at::Tensor values(int rank, std::int64_t n, c10::ScalarType type) {
  return (at::arange(n, at::kDouble) / 8 + rank + 1).to(type);
}

// In double: every rank's values_of(r) reduced with op.
template <class Values>
at::Tensor expected_reduction(Values values_of, int size, c10d::ReduceOp op) {
  at::Tensor expected = values_of(0).to(at::kDouble);
  for (int r = 1; r < size; ++r) {
    const at::Tensor v = values_of(r).to(at::kDouble);
    if (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG) expected = expected + v;
    if (op == c10d::ReduceOp::PRODUCT) expected = expected * v;
    if (op == c10d::ReduceOp::MIN) expected = at::minimum(expected, v);
    if (op == c10d::ReduceOp::MAX) expected = at::maximum(expected, v);
  }
  return op == c10d::ReduceOp::AVG ? expected / size : expected;
}

// 16-bit results are rounded once per pair: compare in their precision.
double tolerance_of(c10::ScalarType type) {
  return type == at::kBFloat16 ? 2e-2 : type == at::kHalf ? 2e-3 : 1e-12;
}

void collectives(mpi_backend& group, const char* label) {
  const int rank = group.getRank();
  const int size = group.getSize();
  const std::int64_t n = 12;
  for (auto type : {at::kFloat, at::kDouble, at::kLong, at::kBFloat16, at::kHalf}) {
    const std::string name = c10::toString(type);
    // all_reduce: sum, avg (floating), product, min, max.
    for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::AVG, c10d::ReduceOp::PRODUCT, c10d::ReduceOp::MIN,
                    c10d::ReduceOp::MAX}) {
      if (op == c10d::ReduceOp::AVG && !at::isFloatingType(type)) continue;
      std::vector<at::Tensor> t{values(rank, n, type)};
      group.allreduce(t, c10d::AllreduceOptions{.reduceOp = op})->wait();
      const at::Tensor expected = expected_reduction([&](int r) { return values(r, n, type); }, size, op);
      const double tolerance = tolerance_of(type);
      const bool ok = at::allclose(t.front().to(at::kDouble), expected, tolerance, tolerance);
      LAW_EXPECT(ok, "%s all_reduce op %d on %s: got %s", label, static_cast<int>(op), name.c_str(),
             c10::str(t.front()).c_str());
    }
    // broadcast from the last rank.
    std::vector<at::Tensor> b{values(rank, n, type)};
    group.broadcast(b, c10d::BroadcastOptions{.rootRank = size - 1})->wait();
    LAW_EXPECT(at::equal(b.front(), values(size - 1, n, type)), "%s broadcast on %s", label, name.c_str());
    // all_gather (list and flat).
    std::vector<std::vector<at::Tensor>> gathered(1);
    for (int r = 0; r < size; ++r) gathered.front().push_back(at::empty({n}, type));
    std::vector<at::Tensor> in{values(rank, n, type)};
    group.allgather(gathered, in)->wait();
    at::Tensor flat = at::empty({size * n}, type);
    at::Tensor mine = values(rank, n, type);
    group._allgather_base(flat, mine)->wait();
    for (int r = 0; r < size; ++r) {
      LAW_EXPECT(at::equal(gathered.front()[static_cast<std::size_t>(r)], values(r, n, type)), "%s allgather %s rank %d",
             label, name.c_str(), r);
      LAW_EXPECT(at::equal(flat.narrow(0, r * n, n), values(r, n, type)), "%s _allgather_base %s rank %d", label,
             name.c_str(), r);
    }
    // reduce_scatter (flat): chunk `rank` of every rank's input, summed.
    at::Tensor input = at::cat({values(rank, size * n, type)});
    at::Tensor out = at::empty({n}, type);
    group._reduce_scatter_base(out, input)->wait();
    at::Tensor expected = at::zeros({n}, at::kDouble);
    for (int r = 0; r < size; ++r) expected += values(r, size * n, type).to(at::kDouble).narrow(0, rank * n, n);
    LAW_EXPECT(at::allclose(out.to(at::kDouble), expected, 2e-2, 2e-2), "%s reduce_scatter %s", label, name.c_str());
    // alltoall_base, equal parts: row r of every rank lands on rank r.
    at::Tensor rows = values(rank, size * 3, type).view({size, 3});
    at::Tensor received = at::empty({size, 3}, type);
    std::vector<int64_t> none;
    group.alltoall_base(received, rows, none, none)->wait();
    for (int r = 0; r < size; ++r) {
      LAW_EXPECT(at::equal(received[r], values(r, size * 3, type).view({size, 3})[rank]), "%s alltoall %s from %d", label,
             name.c_str(), r);
    }
  }
  // Large messages (>= 1 MiB) take MPI's blocking calls on the progress thread.
  {
    const std::int64_t big = 1 << 19;  // 2 MiB of float
    std::vector<at::Tensor> t{at::full({big}, static_cast<float>(rank + 1))};
    auto pending = group.allreduce(t);
    std::vector<at::Tensor> b{at::full({big}, static_cast<float>(rank))};
    auto broadcast = group.broadcast(b, c10d::BroadcastOptions{.rootRank = 0});
    at::Tensor gathered = at::empty({size * big});
    at::Tensor mine = at::full({big}, static_cast<float>(rank));
    auto gathering = group._allgather_base(gathered, mine);
    at::Tensor scattered = at::empty({big});
    at::Tensor whole = at::ones({size * big});
    auto reducing = group._reduce_scatter_base(scattered, whole);
    reducing->wait();
    gathering->wait();
    broadcast->wait();
    pending->wait();
    LAW_EXPECT(at::equal(t.front(), at::full({big}, size * (size + 1) / 2.0f)), "%s large all_reduce", label);
    LAW_EXPECT(at::equal(b.front(), at::zeros({big})), "%s large broadcast", label);
    for (int r = 0; r < size; ++r) {
      LAW_EXPECT(at::equal(gathered.narrow(0, r * big, big), at::full({big}, static_cast<float>(r))), "%s large all_gather",
             label);
    }
    LAW_EXPECT(at::equal(scattered, at::full({big}, static_cast<float>(size))), "%s large reduce_scatter", label);
  }
  // A non-contiguous tensor is reduced and written back in place.
  at::Tensor matrix = at::ones({4, 6}).t();
  std::vector<at::Tensor> strided{matrix};
  group.allreduce(strided)->wait();
  LAW_EXPECT(at::equal(matrix, at::full({6, 4}, static_cast<float>(size))), "%s non-contiguous all_reduce", label);
  // Bitwise reductions on integers.
  std::vector<at::Tensor> bits{at::full({4}, std::int64_t{1} << rank, at::kLong)};
  group.allreduce(bits, c10d::AllreduceOptions{.reduceOp = c10d::ReduceOp::BOR})->wait();
  LAW_EXPECT(bits.front()[0].item<std::int64_t>() == (std::int64_t{1} << size) - 1, "%s BOR", label);
  // Several in flight, waited in reverse: each holds its own result.
  std::vector<std::vector<at::Tensor>> many;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (int k = 0; k < 8; ++k) many.push_back({at::full({1000}, static_cast<double>(k + rank), at::kDouble)});
  for (auto& t : many) works.push_back(group.allreduce(t));
  for (int k = 7; k >= 0; --k) works[static_cast<std::size_t>(k)]->wait();
  for (int k = 0; k < 8; ++k) {
    const double expected = size * k + size * (size - 1) / 2.0;
    LAW_EXPECT(many[static_cast<std::size_t>(k)].front()[0].item<double>() == expected, "%s in flight %d", label, k);
  }
  // gather / scatter at root 0.
  std::vector<std::vector<at::Tensor>> gather_out(1);
  if (rank == 0) {
    for (int r = 0; r < size; ++r) gather_out.front().push_back(at::empty({n}));
  }
  std::vector<at::Tensor> gather_in{values(rank, n, at::kFloat)};
  group.gather(gather_out, gather_in, c10d::GatherOptions{.rootRank = 0})->wait();
  if (rank == 0) {
    for (int r = 0; r < size; ++r) {
      LAW_EXPECT(at::equal(gather_out.front()[static_cast<std::size_t>(r)], values(r, n, at::kFloat)), "%s gather %d",
             label, r);
    }
  }
  std::vector<std::vector<at::Tensor>> scatter_in(1);
  if (rank == 0) {
    for (int r = 0; r < size; ++r) scatter_in.front().push_back(values(r, n, at::kFloat));
  }
  std::vector<at::Tensor> scatter_out{at::empty({n})};
  group.scatter(scatter_out, scatter_in, c10d::ScatterOptions{.rootRank = 0})->wait();
  LAW_EXPECT(at::equal(scatter_out.front(), values(rank, n, at::kFloat)), "%s scatter", label);
  // Point to point around the ring, and a receive from any source.
  std::vector<at::Tensor> outgoing{values(rank, n, at::kFloat)};
  std::vector<at::Tensor> incoming{at::empty({n})};
  auto receiving = group.recv(incoming, (rank + size - 1) % size, 7);
  auto sending = group.send(outgoing, (rank + 1) % size, 7);
  sending->wait();
  receiving->wait();
  LAW_EXPECT(at::equal(incoming.front(), values((rank + size - 1) % size, n, at::kFloat)), "%s ring send/recv", label);
  if (rank == 0) {
    std::vector<at::Tensor> any{at::empty({n})};
    auto from = group.recvAnysource(any, 9);
    from->wait();
    LAW_EXPECT(from->sourceRank() == size - 1 && at::equal(any.front(), values(size - 1, n, at::kFloat)),
           "%s recvAnysource: source %d", label, from->sourceRank());
  } else if (rank == size - 1) {
    std::vector<at::Tensor> t{values(rank, n, at::kFloat)};
    group.send(t, 0, 9)->wait();
  }
  group.barrier()->wait();
}

// Whether this run expects large all-reduces through loom's shared memory
// (tests/dist/mpi.sh also runs with LOOM_MPI_SHARED_MEMORY=0, MPI's path).
bool shared_memory_expected() {
  return loom::cluster::setting_integer("LOOM_MPI_SHARED_MEMORY", 0, 1).value_or(1) == 1;
}

// Large all-reduces (>= 1 MiB; the shared-memory path when the group has
// it, else MPI's blocking calls in pieces): every dtype and reduction, sizes
// that leave a ragged last piece, a non-contiguous tensor, and results
// equal bit for bit on every rank.
void large_reductions(mpi_backend& group, const char* label) {
  const int rank = group.getRank();
  const int size = group.getSize();
  LAW_EXPECT(group.shares_memory() == shared_memory_expected(), "%s: shares_memory() is %d", label,
         static_cast<int>(group.shares_memory()));
  const std::uint64_t shared_before = group.shared_reductions();
  std::uint64_t reductions = 0;
  for (auto type : {at::kFloat, at::kDouble, at::kLong, at::kInt, at::kBFloat16, at::kHalf}) {
    const std::string name = c10::toString(type);
    // Just over 1 MiB: whole pieces and a ragged one.
    const std::int64_t n = (std::int64_t{1} << 20) / c10::elementSize(type) + 4099;
    // Values exact in bf16 and fp16 (so the reference works in double, with
    // no conversions; integers get whole numbers); products of 4 ranks stay
    // below fp16's range.
    const at::Tensor eighths = at::isFloatingType(type) ? (at::arange(n, at::kLong) % 8).to(at::kDouble) / 8
                                                        : at::zeros({n}, at::kDouble);
    auto exact_values = [&](int r) { return eighths + (r + 1); };
    for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::AVG, c10d::ReduceOp::PRODUCT, c10d::ReduceOp::MIN,
                    c10d::ReduceOp::MAX}) {
      if (op == c10d::ReduceOp::AVG && !at::isFloatingType(type)) continue;
      std::vector<at::Tensor> t{exact_values(rank).to(type)};
      group.allreduce(t, c10d::AllreduceOptions{.reduceOp = op})->wait();
      ++reductions;
      const at::Tensor expected = expected_reduction(exact_values, size, op);
      const double tolerance = tolerance_of(type);
      LAW_EXPECT(at::allclose(t.front().to(at::kDouble), expected, tolerance, tolerance), "%s large all_reduce op %d on %s",
             label, static_cast<int>(op), name.c_str());
      // The replicas agree bit for bit.
      at::Tensor all = at::empty({size * n}, type);
      group._allgather_base(all, t.front())->wait();
      for (int r = 0; r < size; ++r) {
        LAW_EXPECT(at::equal(all.narrow(0, r * n, n), t.front()), "%s large all_reduce op %d on %s: rank %d differs",
               label, static_cast<int>(op), name.c_str(), r);
      }
    }
  }
  // Several MiB of float (many pieces on either path), and a non-contiguous one.
  std::vector<at::Tensor> long_one{at::full({(std::int64_t{3} << 19) + 7}, static_cast<float>(rank + 1))};
  group.allreduce(long_one)->wait();
  ++reductions;
  LAW_EXPECT(at::equal(long_one.front(), at::full_like(long_one.front(), size * (size + 1) / 2.0f)), "%s 6 MiB all_reduce",
         label);
  at::Tensor matrix = at::full({300, 1024}, static_cast<float>(rank)).t();
  std::vector<at::Tensor> strided{matrix};
  group.allreduce(strided)->wait();
  ++reductions;
  LAW_EXPECT(at::equal(matrix, at::full({1024, 300}, size * (size - 1) / 2.0f)), "%s large non-contiguous all_reduce", label);
  // min and max through shared memory propagate a NaN of any rank's.
  if (group.shares_memory()) {
    for (auto op : {c10d::ReduceOp::MIN, c10d::ReduceOp::MAX}) {
      std::vector<at::Tensor> t{at::full({1 << 16}, static_cast<float>(rank))};
      if (rank == size - 1) t.front()[5] = std::numeric_limits<float>::quiet_NaN();
      group.allreduce(t, c10d::AllreduceOptions{.reduceOp = op})->wait();
      ++reductions;
      LAW_EXPECT(std::isnan(t.front()[5].item<float>()) && at::isnan(t.front()).sum().item<std::int64_t>() == 1,
             "%s: op %d lost a NaN", label, static_cast<int>(op));
    }
  }
  // The bitwise reductions stay with MPI.
  std::vector<at::Tensor> bits{at::full({1 << 18}, std::int64_t{1} << rank, at::kLong)};
  group.allreduce(bits, c10d::AllreduceOptions{.reduceOp = c10d::ReduceOp::BOR})->wait();
  LAW_EXPECT(bits.front()[0].item<std::int64_t>() == (std::int64_t{1} << size) - 1, "%s large BOR", label);
  const std::uint64_t through_shared = group.shared_reductions() - shared_before;
  LAW_EXPECT(through_shared == (group.shares_memory() ? reductions : 0), "%s: %llu of %llu large all-reduces went through "
         "shared memory", label, static_cast<unsigned long long>(through_shared),
         static_cast<unsigned long long>(reductions));
}

// Calls that differ between ranks (the last rank all-reduces 4 more
// elements; then an empty tensor against one element) fail on every rank
// with each rank's call named, reduce nothing, and leave the group usable.
// Without the check the shorter call returned and the longer one read its
// peer's stale slot: a silent wrong sum.
void mismatched_calls(mpi_backend& group, const char* label) {
  if (!group.shares_memory()) return;
  const int rank = group.getRank();
  const int size = group.getSize();
  const bool last = rank == size - 1;
  auto fails_naming_both = [&](at::Tensor tensor, const std::string& mine, const std::string& theirs) {
    std::vector<at::Tensor> t{tensor};
    const at::Tensor before = tensor.clone();
    try {
      group.allreduce(t)->wait();
    } catch (const loom::peer_error& error) {
      const std::string what = error.what();
      return what.find("the ranks' calls differ") != std::string::npos && what.find(mine) != std::string::npos &&
             what.find(theirs) != std::string::npos && at::equal(tensor, before);
    }
    return false;
  };
  const std::int64_t n = 1 << 18;  // a MiB of float: the longer call has two pieces
  LAW_EXPECT(fails_naming_both(at::ones({last ? n + 4 : n}), "rank 0 has " + std::to_string(size == 1 ? n + 4 : n) +
                                                             " elements of Float (sum)",
                           "rank " + std::to_string(size - 1) + " has " + std::to_string(n + 4) + " elements of Float (sum)"),
         "%s: all_reduce of %lld against %lld elements not refused by name", label, static_cast<long long>(n),
         static_cast<long long>(n + 4));
  LAW_EXPECT(fails_naming_both(at::ones({last ? 1 : 0}), "has 0 elements of Float", "has 1 elements of Float"),
         "%s: an empty all_reduce against one element not refused", label);
  std::vector<at::Tensor> after{at::ones({n})};
  group.allreduce(after)->wait();
  LAW_EXPECT(at::equal(after.front(), at::full({n}, static_cast<float>(size))), "%s: the group after refused calls",
         label);
}

// Rank 0 sends 4 MiB to rank 1, then all-reduces; rank 1 waits for the
// message before it all-reduces. Rank 0's progress thread waits in the
// all-reduce meanwhile, and the message must still move (without CMA, only
// the sender's progress pushes its fragments).
void send_then_all_reduce(mpi_backend& group, const char* label) {
  const int rank = group.getRank();
  std::vector<at::Tensor> message{at::full({1 << 20}, 7.0f)};
  std::vector<at::Tensor> t{at::ones({1 << 18})};
  if (rank == 0) {
    auto sending = group.send(message, 1, 11);
    group.allreduce(t)->wait();
    sending->wait();
  } else {
    if (rank == 1) group.recv(message, 0, 11)->wait();
    group.allreduce(t)->wait();
  }
  LAW_EXPECT(at::equal(message.front(), at::full({1 << 20}, 7.0f)), "%s: the message before the all-reduce", label);
  LAW_EXPECT(at::equal(t.front(), at::full({1 << 18}, static_cast<float>(group.getSize()))), "%s: the all-reduce after "
         "a message", label);
}

// A rank that arrives late at a shared-memory all-reduce: the others end
// with loom::peer_error naming it after the group's timeout, and refuse the
// next one; the late rank ends with the same error at the next piece.
// The tensors a collective was given are released on a thread that issues
// collectives, never on the progress thread, even when the caller drops the
// work unwaited (the progress thread then held the last reference, and
// ThreadSanitizer reported its release racing FSDP's own use of the storage).
void released_where_issued(mpi_backend& group, const char* label) {
  std::thread::id freed_on;
  bool freed = false;
  auto* data = new float[4]{1, 1, 1, 1};
  {
    std::vector<at::Tensor> t{at::from_blob(
        data, {4}, [&](void* p) {
          freed_on = std::this_thread::get_id();
          freed = true;
          delete[] static_cast<float*>(p);
        },
        at::kFloat)};
    group.allreduce(t);  // dropped unwaited: the backend holds the only reference
  }
  // Later collectives on the same group complete after it; each call may
  // release what finished before. Every rank calls as many: each all-reduce
  // counts the ranks still waiting for the release.
  for (int i = 0; i < 20; ++i) {
    std::vector<at::Tensor> waiting{at::full({1}, freed ? 0.0f : 1.0f)};
    group.allreduce(waiting)->wait();
    if (waiting.front().item<float>() == 0.0f) break;
  }
  LAW_EXPECT(freed, "%s: the unwaited all-reduce's tensor was never released", label);
  LAW_EXPECT(!freed || freed_on == std::this_thread::get_id(),
             "%s: the unwaited all-reduce's tensor was released on the progress thread", label);
}

void shared_memory_timeout(MPI_Comm comm) {
  auto group = mpi_backend::create(comm, std::chrono::milliseconds(300));
  if (!group->shares_memory()) return;
  const int rank = group->getRank();
  const int last = group->getSize() - 1;
  std::vector<at::Tensor> t{at::ones({1 << 18})};
  if (rank == last) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::string error;
  try {
    group->allreduce(t)->wait();
  } catch (const loom::peer_error& e) {
    error = e.what();
  }
  if (rank == last) {
    // It passes the first piece's meeting (the others had arrived there),
    // then waits alone at the second, which they left.
    LAW_EXPECT(error.find("did not arrive within the timeout") != std::string::npos, "the late rank: '%s'", error.c_str());
  } else {
    LAW_EXPECT(error.find("rank(s) " + std::to_string(last) + " did not arrive within the timeout of 300 ms") !=
               std::string::npos,
           "the late rank was not named: '%s'", error.c_str());
    std::string next;
    try {
      group->allreduce(t)->wait();
    } catch (const loom::peer_error& e) {
      next = e.what();
    }
    LAW_EXPECT(next.find("out of step") != std::string::npos, "a timed-out group took more work: '%s'", next.c_str());
  }
  MPI_Barrier(comm);
}

void refusals(mpi_backend& group) {
  auto says = [](auto&& call, const std::string& expected) {
    try {
      call();
    } catch (const loom::configuration_error& error) {
      return std::string(error.what()).find(expected) != std::string::npos;
    }
    return false;
  };
  std::vector<at::Tensor> two{at::ones({2}), at::ones({2})};
  LAW_EXPECT(says([&] { group.allreduce(two); }, "one tensor per call"), "two tensors not refused");
  std::vector<at::Tensor> floats{at::ones({2})};
  LAW_EXPECT(says([&] { group.allreduce(floats, c10d::AllreduceOptions{.reduceOp = c10d::ReduceOp::BAND}); },
              "bitwise reductions take integer"),
         "BAND on floats not refused");
  std::vector<at::Tensor> complex{at::ones({2}, at::kComplexFloat)};
  LAW_EXPECT(says([&] { group.allreduce(complex); }, "are not supported"), "complex not refused");
  at::Tensor small = at::empty({3});
  at::Tensor in = at::ones({2});
  LAW_EXPECT(says([&] { group._allgather_base(small, in); }, "needs size x input"), "a wrong all_gather size not refused");
  // A malformed LOOM_MPI_* setting is refused by name when a group is made,
  // before the group touches MPI (a peer with a good one would wait for it).
  for (const auto& [name, value] : {std::pair{"LOOM_MPI_PIECE_BYTES", "4M"}, std::pair{"LOOM_MPI_SHARED_MEMORY", "no"},
                                    std::pair{"LOOM_MPI_YIELD_US", "-1"}}) {
    ::setenv(name, value, 1);
    LAW_EXPECT(says([&] { (void)mpi_backend::create(MPI_COMM_WORLD, std::chrono::seconds(5)); },
                std::string(name) + "='" + value + "' is not accepted: give a whole number from"),
           "%s=%s not refused", name, value);
    ::unsetenv(name);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  laws::rank_for_messages = world_rank;
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  try {
    {
      auto world = mpi_backend::create(MPI_COMM_WORLD, std::chrono::minutes(1));
      collectives(*world, "world");
      large_reductions(*world, "world");
      send_then_all_reduce(*world, "world");
      released_where_issued(*world, "world");
      mismatched_calls(*world, "world");
      refusals(*world);
      // The application's own traffic on MPI_COMM_WORLD does not match loom's
      // (the group works on a duplicate): a message of the application's, sent
      // before loom's collectives, is received after them.
      int token = world_rank == 0 ? 42 : -1;
      MPI_Request pending = MPI_REQUEST_NULL;
      if (world_rank == 0 && world_size > 1) MPI_Isend(&token, 1, MPI_INT, 1, 0, MPI_COMM_WORLD, &pending);
      std::vector<at::Tensor> t{at::ones({4})};
      world->allreduce(t)->wait();
      if (world_rank == 1) MPI_Recv(&token, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (world_rank == 0 && world_size > 1) MPI_Wait(&pending, MPI_STATUS_IGNORE);
      LAW_EXPECT(world_rank > 1 || token == 42, "the application's message was taken by loom's group");
      LAW_EXPECT(world->completed() > 0, "nothing completed");
    }
    if (shared_memory_expected()) shared_memory_timeout(MPI_COMM_WORLD);
    // A split of the application's communicator: two independent groups.
    if (world_size >= 4) {
      MPI_Comm half = MPI_COMM_NULL;
      MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
      {
        auto group = mpi_backend::create(half, std::chrono::minutes(1));
        std::vector<at::Tensor> t{at::full({3}, static_cast<float>(world_rank))};
        group->allreduce(t)->wait();
        float expected = 0;
        for (int r = world_rank % 2; r < world_size; r += 2) expected += static_cast<float>(r);
        LAW_EXPECT(t.front()[0].item<float>() == expected, "split group of parity %d: got %f", world_rank % 2,
               t.front()[0].item<float>());
        collectives(*group, "split");
        large_reductions(*group, "split");
      }
      MPI_Comm_free(&half);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: %s\n", world_rank, error.what());
    ++failures;
  }
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank == 0) {
    std::printf("mpi collectives: world_size=%d %s\n", world_size, all == 0 ? "all checks passed" : "FAILED");
  }
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}
