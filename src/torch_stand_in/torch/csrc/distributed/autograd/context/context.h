// Stand-in for the header Debian's libtorch-dev omits. c10d/reducer.hpp
// includes it but uses only DistAutogradContext::GradCallback (a type alias)
// and std::shared_ptr<DistAutogradContext> (a pointer), so declaring those is
// enough; the class itself lives in libtorch_cpu. Only used when the real
// header is absent (official LibTorch ships it).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch::distributed::autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};

using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace torch::distributed::autograd
