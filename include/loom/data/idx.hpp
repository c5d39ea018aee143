// IDX files (the MNIST family's format), plain or gzip-compressed, read with zlib.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace loom::data {

// Reads an IDX file of unsigned bytes into a uint8 tensor of its dimensions.
// Throws loom::data_error naming the file when it is missing, truncated or
// not IDX; `hint` (e.g. which package provides it) is appended to the message.
at::Tensor read_idx(const std::string& path, const std::string& hint = {});

}  // namespace loom::data
