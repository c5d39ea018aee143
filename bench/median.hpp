// The median of a series of timings, shared by the benchmark programs.
#pragma once

#include <algorithm>
#include <vector>

namespace loom_bench {

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace loom_bench
