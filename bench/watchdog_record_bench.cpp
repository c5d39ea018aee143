// What the collective watchdog costs a collective: one recorder entry (an
// atomic add, a dozen relaxed stores, one steady-clock read), measured over
// 10^6 calls. The bound is 2 us per collective. The full step's
// figure (watchdog on vs off) is bench/watchdog_overhead.sh's.
#include "comm/collective_recorder.hpp"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

namespace {

void BM_record_all_reduce(benchmark::State& state) {
  loom::comm::collective_recorder recorder;
  const at::Tensor bucket = at::zeros({1 << 20});
  for (auto _ : state) {
    recorder.record(loom::comm::collective_kind::all_reduce, &bucket, loom::comm::bytes_of(bucket));
    benchmark::ClobberMemory();
  }
  state.counters["entries"] = static_cast<double>(recorder.entered());
}

// A 4-D tensor: four shape words to store.
void BM_record_all_gather_4d(benchmark::State& state) {
  loom::comm::collective_recorder recorder;
  const at::Tensor activations = at::zeros({2, 3, 4, 5});
  for (auto _ : state) {
    recorder.record(loom::comm::collective_kind::all_gather, &activations, loom::comm::bytes_of(activations));
    benchmark::ClobberMemory();
  }
}

}  // namespace

BENCHMARK(BM_record_all_reduce)->Iterations(1000000)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_record_all_gather_4d)->Iterations(1000000)->Unit(benchmark::kNanosecond);
BENCHMARK_MAIN();
