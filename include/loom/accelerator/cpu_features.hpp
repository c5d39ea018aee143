// What this CPU offers LibTorch's kernels, for the connector's warnings.
// Torch-free: loom-run's connector asks too.
#pragma once

namespace loom::cpu_features {

// Whether LibTorch computes bfloat16 matmuls here with vector instructions.
// Its oneDNN bfloat16 path needs x86 AVX-512 with BW, VL and DQ (LibTorch
// 1.13's mkldnn_bf16_device_check, ATen/native/mkldnn/Utils.h); without
// them a scalar loop computes them: a step of examples/char_transformer took
// 6.0 s under bf16-mixed against 0.25-0.4 s under 32-true on a 2-core AMD
// EPYC with AVX2 only (docs/launching.md). True off x86, where this is not
// known.
bool vector_bf16_matmul();

}  // namespace loom::cpu_features
