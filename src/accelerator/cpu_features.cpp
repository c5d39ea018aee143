#include <loom/accelerator/cpu_features.hpp>

namespace loom::cpu_features {

bool vector_bf16_matmul() {
#if defined(__x86_64__) || defined(__i386__)
  // Read once: the answer cannot change while the process runs.
  static const bool answer = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                             __builtin_cpu_supports("avx512dq");
  return answer;
#else
  return true;
#endif
}

}  // namespace loom::cpu_features
