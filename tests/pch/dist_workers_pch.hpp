// Precompiled for the multi-process workers (tests/dist/*.cpp): LibTorch's
// and loom's headers are most of each worker's compile time (fsdp_worker:
// 17.4 s of CPU at -O1, 11.5 s over this prelude; ddp_worker 13.5 -> 5.9 s).
#include <loom/loom.hpp>
#include <loom/strategy/ddp_engine.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
