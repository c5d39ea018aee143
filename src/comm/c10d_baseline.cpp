#include <loom/comm/c10d_baseline.hpp>

#include "process_group_state.hpp"

#include <loom/errors.hpp>

#include <vector>

namespace loom::comm {

void c10d_allreduce_baseline(process_group& group, at::Tensor& tensor) {
  const auto& c10d = group.state()->inner;  // under the watchdog's recorder, when one records
  if (!c10d || group.kind() != backend::gloo) {
    throw configuration_error("c10d_allreduce_baseline compares with c10d's Gloo allreduce: the group is not Gloo's");
  }
  if (!tensor.is_contiguous() || tensor.scalar_type() != at::kFloat || !tensor.device().is_cpu()) {
    throw configuration_error("c10d_allreduce_baseline takes a contiguous float32 CPU tensor");
  }
  std::vector<at::Tensor> tensors{tensor};
  c10d->allreduce(tensors)->wait();
}

}  // namespace loom::comm
