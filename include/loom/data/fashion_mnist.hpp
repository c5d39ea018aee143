// Fashion-MNIST from its IDX files (Debian's dataset-fashion-mnist installs
// them, gzipped, under /usr/share/datasets/fashion-mnist).
#pragma once

#include <loom/data/tensor_dataset.hpp>

#include <string>

namespace loom::data {

inline constexpr const char* fashion_mnist_default_root = "/usr/share/datasets/fashion-mnist";

enum class split { train, test };

// Images as float32 [N, 1, 28, 28] in [0, 1], labels as int64 [N] in 0..9.
// Reads <root>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
tensor_dataset fashion_mnist(const std::string& root, split which);

}  // namespace loom::data
