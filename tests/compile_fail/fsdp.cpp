// The strategy table's compile-time refusals (fsdp.expect): a precision a sharded strategy
// cannot honour, no_backward_sync where the configuration cannot skip, a unit
// holder around something that is not a module, and dp on cpu or over a module
// that cannot be cloned.
#include <loom/loom.hpp>

#include <torch/nn/modules/linear.h>

void case_fsdp_fp64() { loom::Fabric<loom::cpu, loom::fsdp, loom::fp64> fabric; }

// model_parallel takes Lightning's list: 32-true, bf16-mixed, bf16-true (16-true on cuda).
void case_model_parallel_fp64() { loom::Fabric<loom::cpu, loom::model_parallel, loom::fp64> fabric; }
void case_model_parallel_fp16_mixed() { loom::Fabric<loom::cpu, loom::model_parallel, loom::fp16_mixed> fabric; }

void case_fsdp_cpu_offload_no_backward_sync() {
  loom::Fabric<loom::cpu, loom::fsdp_cpu_offload> fabric;
  torch::nn::Linear net(2, 2);
  auto model = fabric.setup(net);
  auto guard = fabric.no_backward_sync(model);
}

struct not_a_module {
  at::Tensor forward(const at::Tensor& x) { return x; }
};
void case_unit_of_non_module() { loom::unit<not_a_module> holder{nullptr}; }

// ZeRO sets the module up with its one optimizer (Lightning's rule).
void case_deepspeed_setup_module_alone() {
  loom::Fabric<loom::cpu, loom::deepspeed_stage_3> fabric;
  torch::nn::Linear net(2, 2);
  auto model = fabric.setup_module(net);
}
void case_deepspeed_setup_without_optimizer() {
  loom::Fabric<loom::cpu, loom::deepspeed> fabric;
  torch::nn::Linear net(2, 2);
  auto model = fabric.setup(net);
}
void case_deepspeed_fp64() { loom::Fabric<loom::cpu, loom::deepspeed, loom::fp64> fabric; }

// ZeRO takes 16-mixed (its own loss scaler), but cpu has no fp16 kernels.
void case_deepspeed_fp16_on_cpu() { loom::Fabric<loom::cpu, loom::deepspeed, loom::fp16_mixed> fabric; }

// dp runs on cuda only: on cpu use ddp (the string path falls back to it).
void case_dp_on_cpu() { loom::Fabric<loom::cpu, loom::dp, loom::fp32> fabric; }

// dp replicates by clone: a module that is not Cloneable is refused with how to convert it.
struct PlainNetImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) { return x; }
};
void case_dp_not_cloneable() {
  loom::dp strategy;
  PlainNetImpl net;
  loom::dp::module_state replicas;
  auto out = strategy.forward_replicas(replicas, net, [](PlainNetImpl& m, const at::Tensor& x) { return m.forward(x); },
                                       at::ones({2}));
}
