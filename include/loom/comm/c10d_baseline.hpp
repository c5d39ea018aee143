// c10d's own allreduce on the Gloo backend under a loom process group: the
// baseline loom-bench measures loom's all_reduce against
// (loom-bench --fit-raw-baseline, bench/allreduce.sh). It bypasses what loom
// adds (the collective watchdog and its recorder, traffic counting, the
// bf16 and non-contiguous handling), so a rank that never joins hangs it:
// for measurements, not training.
#pragma once

#include <loom/comm/process_group.hpp>

namespace at {
class Tensor;
}

namespace loom::comm {

// Sums `tensor` (contiguous float32 on the CPU) over the group's ranks
// through c10d's ProcessGroupGloo::allreduce and waits. Throws
// loom::configuration_error on a group that is not Gloo's.
void c10d_allreduce_baseline(process_group& group, at::Tensor& tensor);

}  // namespace loom::comm
