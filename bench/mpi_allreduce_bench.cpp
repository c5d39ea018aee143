// loom's all_reduce on its MPI process group against the same call on its
// Gloo group, 1 KiB to 64 MiB, float32, 2 ranks under mpirun
// (bench/allreduce.sh runs it). Both groups live in the same processes
// (Gloo's through a TCP store on 127.0.0.1, MPI's on a duplicate of
// MPI_COMM_WORLD); calls alternate MPI, Gloo, each timed alone; rank 0
// prints per size both medians and the median of the paired ratios, and the
// last line mpi_vs_gloo_1MiB=R mpi_vs_gloo_16MiB=S mpi_vs_gloo_64MiB=T.
//
//   OMP_NUM_THREADS=1 mpirun --allow-run-as-root -n 2 build/bench/mpi_allreduce_bench
#include <loom/comm/process_group.hpp>
#include <loom/environment.hpp>

#include "median.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <climits>
#include <string>
#include <vector>

namespace {

int env_int(const char* name) {
  const auto value = loom::cluster::setting_integer(name, 0, 1 << 20);
  if (!value) {
    std::fprintf(stderr, "mpi_allreduce_bench: %s is not set; run it under mpirun -n 2\n", name);
    std::exit(2);
  }
  return static_cast<int>(*value);
}

}  // namespace

int main() {
  const int rank = env_int("OMPI_COMM_WORLD_RANK");
  const int world = env_int("OMPI_COMM_WORLD_SIZE");
  const long long job = loom::cluster::setting_integer("OMPI_MCA_ess_base_jobid", 0, LLONG_MAX).value_or(7);
  const int port = 20000 + static_cast<int>(job % 20000);
  using namespace loom::comm;
  // MPI's first (it initialises MPI with MPI_THREAD_MULTIPLE), then Gloo's.
  process_group mpi = process_group::connect(rendezvous{.port = port}, rank, world, group_options{.kind = backend::mpi});
  process_group gloo =
      process_group::connect(rendezvous{.port = port + 1}, rank, world, group_options{.kind = backend::gloo});
  struct size_plan {
    const char* label;
    std::int64_t bytes;
    int iterations;
  };
  const std::vector<size_plan> plan = {{"1KiB", 1 << 10, 2000}, {"64KiB", 64 << 10, 1000}, {"1MiB", 1 << 20, 300},
                                       {"4MiB", 4 << 20, 100},  {"16MiB", 16 << 20, 40},   {"64MiB", 64 << 20, 20}};
  if (rank == 0) {
    std::printf("all_reduce through loom, %d ranks, float32: loom's MPI group vs loom's Gloo group (loopback), "
                "alternating calls, medians\n", world);
  }
  std::map<std::string, double> ratio_of;
  for (const auto& size : plan) {
    at::Tensor tensor = at::ones({size.bytes / 4});
    std::vector<double> mpi_times, gloo_times, paired;
    auto time_one = [&](process_group& group) {
      const auto start = std::chrono::steady_clock::now();
      group.all_reduce(tensor);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    (void)time_one(mpi);
    (void)time_one(gloo);
    for (int i = 0; i < size.iterations; ++i) {
      const bool mpi_first = i % 2 == 0;
      const double a = time_one(mpi_first ? mpi : gloo);
      const double b = time_one(mpi_first ? gloo : mpi);
      mpi_times.push_back(mpi_first ? a : b);
      gloo_times.push_back(mpi_first ? b : a);
      paired.push_back(mpi_times.back() / gloo_times.back());
    }
    const double ratio = loom_bench::median(paired);
    ratio_of[size.label] = ratio;
    if (rank == 0) {
      std::printf("size=%-6s calls=%-5d mpi_us=%10.1f gloo_us=%10.1f mpi/gloo paired=%.3f\n", size.label,
                  size.iterations, loom_bench::median(mpi_times) * 1e6, loom_bench::median(gloo_times) * 1e6, ratio);
      std::fflush(stdout);
    }
  }
  if (rank == 0) {
    std::printf("mpi_vs_gloo_1MiB=%.3f mpi_vs_gloo_16MiB=%.3f mpi_vs_gloo_64MiB=%.3f\n", ratio_of["1MiB"],
                ratio_of["16MiB"], ratio_of["64MiB"]);
  }
  gloo.barrier();
  return 0;
}
