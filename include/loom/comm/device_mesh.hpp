// An N-dimensional mesh of ranks with named dimensions (PyTorch's
// init_device_mesh): for each dimension, the sub-group of ranks that differ
// only in that coordinate. Sharding and tensor parallel run their
// collectives on these groups; samplers read the data-parallel coordinate.
#pragma once

#include <loom/comm/process_group.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace loom::comm {

class device_mesh {
 public:
  // A mesh of one rank (every dimension of size 1).
  device_mesh() = default;

  // Ranks laid out row-major over shape (the last dimension varies fastest,
  // as in PyTorch): shape's product must equal world's size and names must be
  // distinct. Collective over world: every rank creates the sub-groups in the
  // same order.
  device_mesh(const process_group& world, std::vector<int> shape, std::vector<std::string> names);

  int ndim() const noexcept { return static_cast<int>(shape_.size()); }
  const std::vector<int>& shape() const noexcept { return shape_; }
  const std::vector<std::string>& names() const noexcept { return names_; }
  // Index of a named dimension; a configuration_error listing the names when unknown.
  int dimension(std::string_view name) const;

  // This rank's coordinate along a dimension, and the dimension's size: for
  // the "data_parallel" dimension, the sampler's rank and replica count.
  int coordinate(std::string_view name) const { return coordinates_[static_cast<std::size_t>(dimension(name))]; }
  int size(std::string_view name) const { return shape_[static_cast<std::size_t>(dimension(name))]; }
  const std::vector<int>& coordinates() const noexcept { return coordinates_; }

  // The group of the ranks that share every coordinate but this one.
  process_group& group(std::string_view name) { return groups_[static_cast<std::size_t>(dimension(name))]; }
  process_group& group(int dimension_index) { return groups_.at(static_cast<std::size_t>(dimension_index)); }

 private:
  std::vector<int> shape_;
  std::vector<std::string> names_;
  std::vector<int> coordinates_;
  std::vector<process_group> groups_;
};

}  // namespace loom::comm
