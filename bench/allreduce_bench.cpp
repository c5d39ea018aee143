// loom's all_reduce against raw c10d's allreduce on the same tensors, 1 KiB
// to 64 MiB, Gloo on loopback. Run it under loom-run on 2 ranks:
//
//   OMP_NUM_THREADS=1 build/tools/loom-run --devices 2 build/bench/allreduce_bench
//
// Both ranks run the same fixed schedule of collectives: for each size, a
// fixed number of pairs of calls, one through loom and one through a raw
// ProcessGroupGloo built by hand (the order alternates between pairs), each
// call timed alone. Rank 0 prints one line per size: both medians and their
// ratio, and the ratio of a second raw group to the first: the noise floor
// of the machine in the same run.
#include <loom/compat_c10d.hpp>
#include <loom/loom.hpp>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <string>
#include <thread>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

int main() {
  loom::Fabric<loom::cpu, loom::parallel> fabric;
  fabric.launch();
  const int rank = fabric.global_rank();
  const int world = fabric.world_size();
  if (world < 2) {
    std::fprintf(stderr, "allreduce_bench: run it under loom-run --devices 2 (world size is %d)\n", world);
    return 2;
  }
  const char* dir = std::getenv(loom::cluster::rendezvous_dir_variable);
  if (dir == nullptr) {
    std::fprintf(stderr, "allreduce_bench: start it with loom-run on one node (it needs LOOM_RENDEZVOUS_DIR)\n");
    return 2;
  }
  // The raw baseline: a ProcessGroupGloo built by hand with the options loom uses.
  auto store = c10::make_intrusive<c10d::FileStore>(std::string(dir) + "/raw-baseline", world);
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::minutes(5));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->threads = 2;
  auto raw = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("raw", store), rank,
                                                        world, options);
  // A second raw group: raw against raw gives the noise floor of this machine in the same run.
  auto control_options = c10d::ProcessGroupGloo::Options::create(std::chrono::minutes(5));
  control_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  control_options->threads = 2;
  auto control = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("control", store),
                                                            rank, world, control_options);

  struct size_plan {
    const char* label;
    int64_t bytes;
    int iterations;
  };
  const std::vector<size_plan> plan = {
      {"1KiB", 1 << 10, 1000},  {"4KiB", 4 << 10, 1000},  {"16KiB", 16 << 10, 1000}, {"64KiB", 64 << 10, 600},
      {"256KiB", 256 << 10, 400}, {"1MiB", 1 << 20, 200},  {"4MiB", 4 << 20, 150},    {"16MiB", 16 << 20, 50},
      {"64MiB", 64 << 20, 20},
  };
  if (rank == 0) std::printf("all_reduce, %d ranks, Gloo on loopback, float32, median per call over rotating triples (loom, raw, raw2)\n", world);
  for (const auto& size : plan) {
    at::Tensor loom_tensor = at::ones({size.bytes / 4});
    std::vector<at::Tensor> raw_tensors{at::ones({size.bytes / 4})};
    std::vector<at::Tensor> control_tensors{at::ones({size.bytes / 4})};
    std::vector<double> loom_times, raw_times, control_times, copy_times;
    auto time_one = [](auto&& call) {
      const auto start = std::chrono::steady_clock::now();
      call();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    auto loom_call = [&] { fabric.all_reduce_(loom_tensor); };
    auto raw_call = [&] { raw->allreduce(raw_tensors)->wait(); };
    auto control_call = [&] { control->allreduce(control_tensors)->wait(); };
    // Warm-up, then calls in rotating triples, each timed alone: drift and
    // noise fall on every side alike.
    loom_call();
    raw_call();
    control_call();
    fabric.barrier();
    for (int turn = 0; turn < size.iterations; ++turn) {
      // Rotate the order: loom, raw, control / raw, control, loom / control, loom, raw.
      for (int slot = 0; slot < 3; ++slot) {
        switch ((turn + slot) % 3) {
          case 0: loom_times.push_back(time_one(loom_call)); break;
          case 1: raw_times.push_back(time_one(raw_call)); break;
          default: control_times.push_back(time_one(control_call)); break;
        }
      }
    }
    // The out-of-place form (returns a new tensor; the copy is its cost).
    for (int call = 0; call < std::max(3, size.iterations / 10); ++call) {
      copy_times.push_back(time_one([&] { (void)fabric.all_reduce(loom_tensor); }));
    }
    loom_tensor.fill_(1.0);
    raw_tensors[0].fill_(1.0);
    control_tensors[0].fill_(1.0);
    if (rank == 0) {
      const double loom_us = median(loom_times) * 1e6;
      const double raw_us = median(raw_times) * 1e6;
      const double control_us = median(control_times) * 1e6;
      // Ratios within each triple, whose calls ran moments apart: slow
      // stretches of the machine fall on both sides of one ratio.
      std::vector<double> paired, paired_control;
      for (std::size_t i = 0; i < loom_times.size(); ++i) {
        paired.push_back(loom_times[i] / raw_times[i]);
        paired_control.push_back(control_times[i] / raw_times[i]);
      }
      std::printf("size=%-7s calls=%-5d loom_us=%9.1f raw_us=%9.1f ratio=%.3f paired=%.3f | noise raw2/raw: ratio=%.3f "
                  "paired=%.3f | copy_us=%.1f\n",
                  size.label, size.iterations, loom_us, raw_us, loom_us / raw_us, median(paired), control_us / raw_us,
                  median(paired_control), median(copy_times) * 1e6);
      std::fflush(stdout);
    }
  }
  fabric.barrier();
  return 0;
}
