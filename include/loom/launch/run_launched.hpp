// The body of Fabric.launch(fn), shared by the static and the erased Fabric:
// fn runs on every process; a process the fork launcher made ends when fn
// returns (status 0, or 1 if it threw), so it never runs the parent's code.
#pragma once

#include <cstdlib>
#include <exception>
#include <iostream>
#include <utility>

namespace loom::detail {

template <class FabricType, class Function>
decltype(auto) run_launched(FabricType& fabric, Function&& function, bool forked_child) {
  if (forked_child) {
    int status = 0;
    try {
      std::forward<Function>(function)(fabric);
    } catch (const std::exception& error) {
      std::cerr << "loom: rank " << fabric.global_rank() << ": " << error.what() << std::endl;
      status = 1;
    }
    std::cout << std::flush;
    std::_Exit(status);
  }
  return std::forward<Function>(function)(fabric);
}

}  // namespace loom::detail
