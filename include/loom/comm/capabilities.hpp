// What each c10d backend does natively and what loom's comm/ must emulate on
// it: read by the collectives, so a new backend (MPI) or a recording wrapper
// states its row here and no caller changes.
#pragma once

#include <string_view>

namespace loom::comm {

enum class backend { gloo, nccl, mpi };

struct backend_capabilities {
  std::string_view name;
  bool reduce_scatter = false;      // a native reduce-scatter into one flat buffer
  bool all_gather_into = false;     // a native all-gather into one flat buffer (_allgather_base)
  bool mean = false;                // ReduceOp::AVG
  bool bf16_collectives = false;    // bf16 in collectives (Gloo: only send/recv move it)
  bool bf16_reductions = false;     // bf16 summed by the backend
  bool point_to_point = true;       // send/recv, what the Gloo emulations are built from
};

// Measured on Debian's LibTorch 1.13 (facts-sharding.md §1): Gloo has no
// reduce_scatter, no _allgather_base, no AVG, and refuses bf16 in every
// collective ("Invalid scalar type"); NCCL has all of them.
constexpr backend_capabilities capabilities_of(backend kind) noexcept {
  switch (kind) {
    case backend::gloo: return {.name = "gloo"};
    // loom's own group over MPI (src/comm/mpi_backend.cpp, the `mpi` build
    // feature): MPI_Ireduce_scatter_block, MPI_Iallgather, AVG as a sum
    // divided, bf16/fp16 moved as 16-bit words and summed by loom's MPI operations.
    case backend::mpi:
      return {.name = "mpi",
              .reduce_scatter = true,
              .all_gather_into = true,
              .mean = true,
              .bf16_collectives = true,
              .bf16_reductions = true};
    case backend::nccl:
      return {.name = "nccl",
              .reduce_scatter = true,
              .all_gather_into = true,
              .mean = true,
              .bf16_collectives = true,
              .bf16_reductions = true};
  }
  return {};
}

// How a backend without a native reduce-scatter / all-gather-into gets one.
// point_to_point: every rank posts one send and one receive per peer at once
// (for 2 ranks, the pairwise exchange DDP uses), then reduces locally in rank
// order; alltoall: c10d's alltoall_base, then the same local reduction (the
// measured fallback, 0.43-0.73 of an all_reduce here).
enum class emulation { point_to_point, alltoall };

}  // namespace loom::comm
