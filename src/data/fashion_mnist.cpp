#include <loom/data/fashion_mnist.hpp>
#include <loom/data/idx.hpp>

#include <ATen/ATen.h>

#include <filesystem>

namespace loom::data {
namespace {

std::string locate(const std::string& root, const std::string& stem) {
  // Prefer the gzipped file Debian ships; accept an unpacked copy.
  const std::filesystem::path base = std::filesystem::path(root) / stem;
  const std::filesystem::path gz = base.string() + ".gz";
  if (std::filesystem::exists(gz)) return gz.string();
  if (std::filesystem::exists(base)) return base.string();
  return gz.string();  // read_idx names it in the "missing" error
}

}  // namespace

tensor_dataset fashion_mnist(const std::string& root, split which) {
  const std::string prefix = which == split::train ? "train" : "t10k";
  const std::string hint =
      "Fashion-MNIST comes from Debian's package dataset-fashion-mnist (apt-get install dataset-fashion-mnist), "
      "which puts it in /usr/share/datasets/fashion-mnist; point --data at another directory that holds the IDX "
      "files";
  const std::string images_path = locate(root, prefix + "-images-idx3-ubyte");
  const std::string labels_path = locate(root, prefix + "-labels-idx1-ubyte");
  at::Tensor images = read_idx(images_path, hint);
  at::Tensor labels = read_idx(labels_path, hint);

  if (images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28) {
    throw data_error("cannot use " + images_path + ": expected images of shape [N, 28, 28], found " +
                     std::to_string(images.dim()) + " dimensions. " + hint);
  }
  if (labels.dim() != 1) throw data_error("cannot use " + labels_path + ": expected a 1-d label file. " + hint);
  if (labels.size(0) != images.size(0)) {
    throw data_error("cannot use " + images_path + " with " + labels_path + ": " + std::to_string(images.size(0)) +
                     " images but " + std::to_string(labels.size(0)) + " labels");
  }
  if (labels.max().item<int>() > 9) throw data_error("cannot use " + labels_path + ": a label is above 9");

  return tensor_dataset(images.to(at::kFloat).div_(255.0).unsqueeze_(1), labels.to(at::kLong));
}

}  // namespace loom::data
