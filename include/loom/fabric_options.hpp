// The run-time options of a Fabric (static or erased).
#pragma once

#include <loom/callbacks/callback.hpp>
#include <loom/devices.hpp>
#include <loom/loggers/logger.hpp>
#include <loom/util/clip_options.hpp>

#include <optional>
#include <vector>

namespace loom {

struct fabric_options {
  devices_spec devices;  // not given: 1, or what an external launcher started
  int num_nodes = 1;
  std::vector<logger> loggers;
  std::vector<callback> callbacks;
  // Set by make_fabric, whose connector has already reconciled the LT_*
  // values of loom-run with the configuration (and applied Lightning's
  // fallbacks, such as 16-mixed -> bf16-mixed on cpu).
  bool checked_by_connector = false;
};


}  // namespace loom
