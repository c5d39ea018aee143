// model_parallel's compiled part: the mesh's sizes.
#include <loom/errors.hpp>
#include <loom/strategy/model_parallel.hpp>

#include <algorithm>
#include <string>

namespace loom::detail {

std::pair<int, int> model_parallel_sizes(int data_parallel, int tensor_parallel, int world_size, int num_nodes) {
  const int dp = data_parallel > 0 ? data_parallel : num_nodes;
  const int tp = tensor_parallel > 0 ? tensor_parallel : world_size / std::max(num_nodes, 1);
  if (dp * tp != world_size) {
    throw configuration_error("model_parallel: data_parallel_size " + std::to_string(dp) + " x tensor_parallel_size " +
                              std::to_string(tp) + " = " + std::to_string(dp * tp) + " ranks, but the world size is " +
                              std::to_string(world_size) + "; the two must multiply to the world size");
  }
  return {dp, tp};
}

}  // namespace loom::detail
