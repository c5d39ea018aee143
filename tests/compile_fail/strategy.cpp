// One case per member of the strategy contract: a strategy written from
// scratch that lacks exactly that member fails with the sentence that names
// it (strategy.expect). Built with -fsyntax-only by check.sh.
#include "../strategy_models.hpp"

using models::bare_strategy;
using models::member;

void case_missing_setup_environment() { loom::Fabric<loom::cpu, bare_strategy<member::setup_environment>, loom::fp32> fabric; }
void case_missing_ranks() { loom::Fabric<loom::cpu, bare_strategy<member::ranks>, loom::fp32> fabric; }
void case_missing_barrier() { loom::Fabric<loom::cpu, bare_strategy<member::barrier>, loom::fp32> fabric; }
void case_missing_module_state() { loom::Fabric<loom::cpu, bare_strategy<member::module_state>, loom::fp32> fabric; }
void case_missing_setup_module() { loom::Fabric<loom::cpu, bare_strategy<member::setup_module>, loom::fp32> fabric; }
void case_missing_forward() { loom::Fabric<loom::cpu, bare_strategy<member::forward>, loom::fp32> fabric; }
void case_missing_backward() { loom::Fabric<loom::cpu, bare_strategy<member::backward>, loom::fp32> fabric; }
void case_missing_optimizer_step() { loom::Fabric<loom::cpu, bare_strategy<member::optimizer_step>, loom::fp32> fabric; }
void case_missing_zero_grad() { loom::Fabric<loom::cpu, bare_strategy<member::zero_grad>, loom::fp32> fabric; }
void case_missing_clip_gradients() { loom::Fabric<loom::cpu, bare_strategy<member::clip_gradients>, loom::fp32> fabric; }
void case_missing_no_backward_sync() { loom::Fabric<loom::cpu, bare_strategy<member::no_backward_sync>, loom::fp32> fabric; }
void case_missing_save_checkpoint() { loom::Fabric<loom::cpu, bare_strategy<member::save_checkpoint>, loom::fp32> fabric; }
void case_missing_load_checkpoint() { loom::Fabric<loom::cpu, bare_strategy<member::load_checkpoint>, loom::fp32> fabric; }
void case_missing_all_reduce() { loom::Fabric<loom::cpu, bare_strategy<member::all_reduce>, loom::fp32> fabric; }
void case_missing_all_gather() { loom::Fabric<loom::cpu, bare_strategy<member::all_gather>, loom::fp32> fabric; }
void case_missing_broadcast() { loom::Fabric<loom::cpu, bare_strategy<member::broadcast>, loom::fp32> fabric; }
void case_missing_reduce_scatter() { loom::Fabric<loom::cpu, bare_strategy<member::reduce_scatter>, loom::fp32> fabric; }
void case_missing_reduce_boolean_decision() { loom::Fabric<loom::cpu, bare_strategy<member::reduce_boolean_decision>, loom::fp32> fabric; }
void case_missing_joint_setup() { loom::Fabric<loom::cpu, bare_strategy<member::joint_setup, true>, loom::fp32> fabric; }

// The optional members are opt-in by a flag: a member without its flag, or a
// flag whose member is misspelt, is refused (before, it was ignored).
struct sampler_ranks_without_flag : bare_strategy<> {
  int sampler_replicas() { return 1; }
  int sampler_rank() { return 0; }
};
void case_sampler_ranks_without_flag() { loom::Fabric<loom::cpu, sampler_ranks_without_flag, loom::fp32> fabric; }
struct launch_misspelt : bare_strategy<> {
  static constexpr bool launches_processes = true;
  void lanch() {}
  bool is_forked_child() const { return false; }
};
void case_launch_misspelt() { loom::Fabric<loom::cpu, launch_misspelt, loom::fp32> fabric; }
struct forward_replicas_without_flag : bare_strategy<> {
  template <class Impl, class Body, class... Args>
  at::Tensor forward_replicas(models::empty_state& /*state*/, Impl& module, Body&& body, const Args&... arguments) {
    return body(module, arguments...);
  }
};
void case_forward_replicas_without_flag() { loom::Fabric<loom::cpu, forward_replicas_without_flag, loom::fp32> fabric; }
