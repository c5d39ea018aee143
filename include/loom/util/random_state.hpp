// The state of torch's default generators in one byte tensor, for exact
// resume: the CPU generator and, in a CUDA build with a device, that
// device's generator. Dropout and other random ops draw from these; loom's
// distributed sampler does not (it reseeds from seed + epoch).
#pragma once

#include <ATen/core/Tensor.h>

namespace loom {

// A 1-D uint8 tensor (on the CPU) holding every default generator's state.
at::Tensor capture_random_state();
// Restores what capture_random_state returned (same build, same devices);
// a tensor of another size is loom::checkpoint_error.
void restore_random_state(const at::Tensor& state);

}  // namespace loom
