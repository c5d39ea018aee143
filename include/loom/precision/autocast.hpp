// The guards a precision's contexts return: autocast on one device type
// (loom/util/autocast_guard.hpp, which strategies use too) and the default
// dtype.
#pragma once

#include <loom/util/autocast_guard.hpp>

#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarType.h>

namespace loom {

// Sets torch's default dtype for its lifetime (Lightning's _DtypeContextManager):
// modules built and factory tensors made inside get this dtype.
class [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]] default_dtype_guard {
 public:
  explicit default_dtype_guard(c10::ScalarType dtype) : previous_(c10::get_default_dtype()) {
    c10::set_default_dtype(caffe2::TypeMeta::fromScalarType(dtype));
  }
  default_dtype_guard(const default_dtype_guard&) = delete;
  default_dtype_guard& operator=(const default_dtype_guard&) = delete;
  ~default_dtype_guard() { c10::set_default_dtype(previous_); }

 private:
  caffe2::TypeMeta previous_;
};

}  // namespace loom
