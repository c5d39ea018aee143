// Lightning's rules for the `devices` argument, without torch headers, so that
// the connector and loom-run can validate flags before anything starts.
#pragma once

#include <loom/devices.hpp>

#include <string_view>
#include <vector>

namespace loom::detail {

// cpu: a positive number of processes ("auto" is 1). Index lists are refused:
// processes on a CPU are not addressed by index.
int parse_cpu_devices(const devices_spec& devices);

// cuda: a count (first n devices), -1 or "-1" (all), "auto" (all), "0,2" or
// {0, 2} (those indices). Every index must be below available_count and unique.
std::vector<int> parse_cuda_devices(const devices_spec& devices, int available_count);

}  // namespace loom::detail
