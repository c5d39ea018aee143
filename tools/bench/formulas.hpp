// What each strategy's collectives must carry and what model state a rank
// must hold, per step, for a model of this shape: the formulas a cell's
// counts are checked against. No torch headers.
//
// Ψ is the parameter count; P_n the sum over units (the root and each
// loom::unit, loom/strategy/unit_layout.hpp: each Linear of the MLP) of the
// unit's own parameters padded to a multiple of n (a unit's flat shard); N
// the ranks.
// Per precision (on the CPU, Gloo), in bytes per element:
//   e  parameters, gradients, Adam's moments: 4 at 32-true and the mixed
//      precisions (float32 parameters under autocast), 2 at bf16-true
//   g  fsdp's all-gathered parameters: the parameters' dtype (e)
//   r  fsdp's reduce-scatter: reduce_dtype, 2 at the mixed precisions
//      (Lightning's FSDPPrecision), else e
//   a  an all-reduce's element as counted: 4 at every one of these (the
//      group counts what it moves: float32, and bfloat16 moved as float32;
//      fsdp's all-reduces of float16 gradients count 4 too)
// K: the optimizer's state bytes per parameter in float32 (Adam 8, SGD 0);
// in the parameters' dtype it is K e / 4.
//
// payload_formula, per rank and step:
//   raw, single_device, parallel, any cell at N = 1: 0
//   ddp: 4Ψ (gradient buckets all-reduced); find_unused_parameters=true:
//     + 4 bytes per parameter tensor (the Reducer's used-parameter map)
//   fsdp NO_SHARD: aΨ (the gradients, float32 or bfloat16, all-reduced)
//   fsdp FULL_SHARD, ZeRO-3 at 32-true: (2g + r)P_N (all-gather in forward
//     and again in backward, reduce-scatter), but the root unit's gRoot_N
//     once: the root stays gathered from its forward to its backward, as in
//     torch's FSDP (P_N = units + Root_N; the MLP's root holds nothing)
//   fsdp SHARD_GRAD_OP, ZeRO-1 and -2 at 32-true: (g + r)P_N
//   fsdp HYBRID_SHARD, mesh R x S (R replicas of S shards, both given as
//     device_mesh_replicate and device_mesh_shard; else S = N on one node):
//     the FULL_SHARD payload on the shard group, (2g + r)P_S, + the reduced
//     shard all-reduced across replicas, aP_S/S
//   deepspeed at 16 bits (any precision but 32-true: DeepSpeed's bf16/fp16
//     mode, 16-bit parameters, gradients reduced in float32): ZeRO-1 and -2
//     (2 + 4)P_N, ZeRO-3 (2 + 2 + 4)P_N
//   model_parallel, tensor parallel T on D data-parallel ranks: 4 x batch x
//     (the row-wise layers' outputs, all-reduced in forward, + the
//     column-wise layers' inputs but the first's, all-reduced in backward,
//     + an odd last layer's output, all-gathered in forward; an even number
//     of layers below 32-true), + with D > 1 the FULL_SHARD payload of this
//     rank's tensor-parallel parameters over the D ranks
//
// state_formula, the bytes of model state a rank holds between steps
// (parameters, gradients, the optimizer's state, the engines' flat buffers):
//   raw, single_device, parallel, fsdp NO_SHARD, ddp at N = 1 (no Reducer): (2e + Ke/4)Ψ
//     (16Ψ at 32-true with Adam)
//   ddp at N >= 3: (12 + K)Ψ: the Reducer's bucket copies of the gradients
//     (4Ψ) besides. At N = 2 none: loom's two-rank exchange also keeps pooled
//     receive buffers, as many as buckets in flight together (measured on the
//     default MLP: 22.9 bytes per parameter); find_unused_parameters: none
//     (its used-parameter maps: 64 or 128 bytes more at N = 1 on the small MLP)
//   fsdp FULL_SHARD (HYBRID_SHARD: S for N), ZeRO-3 at 32-true: (2e + Ke/4)P_N/N.
//     HYBRID_SHARD's all-reduce across 2 replicas runs loom's two-rank
//     exchange, whose pooled receive buffers (at most the shards, aP_S/S)
//     the formula leaves out
//   fsdp SHARD_GRAD_OP, ZeRO-2 at 32-true: eP_N + (e + Ke/4)P_N/N (full
//     parameters kept, in the units' padded flat buffers)
//   ZeRO-1 at 32-true: 8P_N + KP_N/N (full parameters and gradients kept)
//   deepspeed at 16 bits: 16-bit parameters and gradients, a float32 master
//     partition and float32 optimizer state: ZeRO-1 4P_N + (4 + K)P_N/N,
//     ZeRO-2 2P_N + (6 + K)P_N/N, ZeRO-3 (8 + K)P_N/N
//   model_parallel, an even number of layers: (2e + Ke/4) x this rank's
//     tensor-parallel parameters (column-wise layers: weight and bias / T;
//     row-wise: weight / T, the bias whole), / D padded per layer when D > 1.
//     The tensor-parallel group may also keep a pooled receive buffer of one
//     activation (batch x width floats; measured: 0 or 1 KiB at batch 8,
//     width 32, from run to run), which the formula leaves out
// No value where no formula is written: other precisions (16-true, 64-true,
// transformer-engine), NVMe offload, model_parallel on a library's model
// (its plan is the library's).
#pragma once

#include "cell.hpp"

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace loom_bench {

// What the formulas need of a model (read from the model as built).
struct model_shape {
  std::int64_t root_numel = 0;            // the root unit's own parameters (elements)
  std::vector<std::int64_t> unit_numels;  // each loom::unit's own parameters, in order (those with any)
  std::int64_t parameter_tensors = 0;
  std::vector<std::int64_t> widths;  // the MLP's (model_parallel's formulas); empty for a library's model
};

std::optional<double> state_formula(const cell& spec, const model_shape& shape, int world_size,
                                    std::string_view precision, double optimizer_bytes);
// K: the optimizer's state bytes per parameter (adam: 8, sgd: 0).
double optimizer_state_bytes(std::string_view optimizer);
std::optional<double> payload_formula(const cell& spec, const model_shape& shape, int world_size, std::int64_t batch,
                                      std::string_view precision);

}  // namespace loom_bench
