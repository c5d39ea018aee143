// loom: Lightning Fabric for C++. The umbrella header: every public part but
// tensor parallelism's layers and plans (<loom/tp/parallelize.hpp>), which
// bring LibTorch's Linear, Embedding, LayerNorm and Dropout modules that most
// programs never parse (PyTorch keeps torch.distributed.tensor.parallel apart too).
// The strategies' engines (ddp_engine, fsdp_engine, nvme_stream, zero_config,
// distributed_runtime, launch/supervisor) are compiled in libloom and not
// included here: a strategy reaches its engine through calls declared in its
// own header (tests/check_layers.py checks that nothing here reaches them).
#pragma once

#include <loom/accelerator/cpu.hpp>
#include <loom/accelerator/cuda.hpp>
#include <loom/callbacks/callback.hpp>
#include <loom/callbacks/hooks.hpp>
#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/state.hpp>
#include <loom/cluster/environment.hpp>
#include <loom/comm/autograd.hpp>
#include <loom/comm/capabilities.hpp>
#include <loom/comm/device_mesh.hpp>
#include <loom/comm/process_group.hpp>
#include <loom/comm/reduce_op.hpp>
#include <loom/comm/work.hpp>
#include <loom/compat.hpp>
#include <loom/compatibility.hpp>
#include <loom/concepts.hpp>
#include <loom/data/distributed_sampler.hpp>
#include <loom/data/fashion_mnist.hpp>
#include <loom/data/idx.hpp>
#include <loom/data/tensor_dataset.hpp>
#include <loom/data/worker_seed.hpp>
#include <loom/devices.hpp>
#include <loom/errors.hpp>
#include <loom/fabric.hpp>
#include <loom/loggers/csv_logger.hpp>
#include <loom/loggers/logger.hpp>
#include <loom/precision/autocast.hpp>
#include <loom/precision/grad_scaler.hpp>
#include <loom/precision/mixed.hpp>
#include <loom/precision/true_precision.hpp>
#include <loom/runtime/names.hpp>
#include <loom/strategy/collectives.hpp>
#include <loom/strategy/ddp.hpp>
#include <loom/strategy/ddp_options.hpp>
#include <loom/strategy/deepspeed.hpp>
#include <loom/strategy/deepspeed_options.hpp>
#include <loom/strategy/fsdp.hpp>
#include <loom/strategy/fsdp_options.hpp>
#include <loom/strategy/dp.hpp>
#include <loom/strategy/model_parallel.hpp>
#include <loom/strategy/zero_loss_scaler.hpp>
#include <loom/strategy/no_sync_guard.hpp>
#include <loom/strategy/unit.hpp>
#include <loom/strategy/parallel.hpp>
#include <loom/strategy/single_device.hpp>
#include <loom/util/apply_to_collection.hpp>
#include <loom/util/seed.hpp>
#include <loom/wrap/dataloader.hpp>
#include <loom/wrap/module.hpp>
#include <loom/wrap/optimizer.hpp>
