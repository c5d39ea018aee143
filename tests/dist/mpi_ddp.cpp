// DDP and FSDP on loom's MPI process group, under mpirun (tests/dist/mpi.sh):
// the shared law against single_device (N ranks with B/N rows equal one
// process with B), with process_group_backend = mpi. DDP's Reducer drives
// the MPI group's all-reduces; FSDP uses its native reduce-scatter and
// all-gather (MPI_Ireduce_scatter_block, MPI_Iallgather), which Gloo lacks.
#include "law_models.hpp"

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdio>
#include <string>

// `mpi_ddp ddp` or `mpi_ddp fsdp`: one Fabric per job (under mpirun each
// Fabric hosts its store on the port derived from the job id).
template <class F, class Make>
int run(F& fabric, Make&& make, const char* what) {
  fabric.launch();
  laws::rank_for_messages = fabric.global_rank();
  LAW_EXPECT(fabric.strategy().group().kind() == loom::comm::backend::mpi, "the %s group is not MPI's", what);
  const auto result = laws::law_equivalence(fabric, make, what);
  const bool everyone = fabric.reduce_boolean_decision(laws::failures == 0, /*all=*/true);
  if (fabric.is_global_zero()) {
    std::printf("law (mpi): %s, world_size=%d: max |strategy - single| after 20 Adam steps = %.3g\n", what,
                fabric.world_size(), result.max_difference);
    std::printf("mpi laws: world_size=%d %s\n", fabric.world_size(), everyone ? "all checks passed" : "FAILED");
  }
  return laws::failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "ddp";
  try {
    if (which == "split") {
      // The application owns MPI: it splits its world by parity, and each
      // half trains a Fabric of its own on its communicator, at the same time.
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      int world_rank = 0, world_size = 1;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      MPI_Comm_size(MPI_COMM_WORLD, &world_size);
      MPI_Comm half = MPI_COMM_NULL;
      MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
      int status = 0;
      {
        loom::Fabric<loom::cpu, loom::ddp, loom::fp32> fabric(
            {}, loom::ddp(loom::ddp_options{
                    .process = {.backend = loom::comm::backend::mpi, .mpi_communicator = MPI_Comm_c2f(half)}}));
        laws::rank_for_messages = world_rank;
        LAW_EXPECT(fabric.world_size() == world_size / 2 && fabric.global_rank() == world_rank / 2,
                   "the Fabric on a half has world size %d and rank %d", fabric.world_size(), fabric.global_rank());
        status = run(fabric, laws::make_plain, world_rank % 2 == 0 ? "DDP on the even half's communicator"
                                                                    : "DDP on the odd half's communicator");
      }
      MPI_Comm_free(&half);
      MPI_Finalize();
      return status;
    }
    if (which == "forever") {
      // Trains until killed (mpi.sh's kill -9 test).
      loom::Fabric<loom::cpu, loom::ddp, loom::fp32> fabric(
          {}, loom::ddp(loom::ddp_options{.process = {.backend = loom::comm::backend::mpi}}));
      fabric.launch();
      auto net = laws::make_plain();
      torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
      auto [model, optimizer] = fabric.setup(net, adam);
      std::printf("rank %d pid %d training\n", fabric.global_rank(), static_cast<int>(::getpid()));
      std::fflush(stdout);
      for (int step = 0;; ++step) laws::train_steps(fabric, model, optimizer, step % 100, step % 100 + 1);
    }
    if (which == "fsdp") {
      loom::Fabric<loom::cpu, loom::fsdp, loom::fp32> fabric(
          {}, loom::fsdp(loom::fsdp_options{.process = {.backend = loom::comm::backend::mpi}}));
      return run(fabric, laws::make_net, "FSDP on the MPI group (its native reduce-scatter and all-gather)");
    }
    loom::Fabric<loom::cpu, loom::ddp, loom::fp32> fabric(
        {}, loom::ddp(loom::ddp_options{.process = {.backend = loom::comm::backend::mpi}}));
    return run(fabric, laws::make_plain, "DDP on the MPI group (its Reducer's all-reduces)");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mpi_ddp rank %d: %s\n", laws::rank_for_messages, error.what());
    return 1;
  }
}
