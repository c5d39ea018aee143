// Precompiled for the test executable: LibTorch's headers dominate each TU.
#include <loom/loom.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "../catch.hpp"
