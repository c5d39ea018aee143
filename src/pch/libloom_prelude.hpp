// libloom's precompiled prelude: the standard and LibTorch headers most of
// src/'s TUs read. Parsing them is most of a TU's compile time (placement.cpp:
// 15.8 s plain, 4.5 s over this prelude, on a 2-core AMD EPYC), so Meson
// compiles them once (cpp_pch in src/meson.build; -Db_pch=false turns it off)
// and passes them to every libloom TU with -include. It holds no loom header,
// and TUs still include what they use: header_self_containment compiles every
// loom header alone, and the portability test compiles every TU over
// LibTorch 2.11's own headers, without this prelude.
// Not for TUs that must read LibTorch's headers under other macros
// (util/flop_counter.cpp defines NDEBUG first): those stay outside libloom's
// own target (src/meson.build).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
