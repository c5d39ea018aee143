// device_mesh: sub-groups per dimension, created in one order on every rank.
#include <loom/comm/device_mesh.hpp>
#include <loom/errors.hpp>

#include <algorithm>
#include <numeric>

namespace loom::comm {

namespace {
std::string shape_text(const std::vector<int>& shape, const std::vector<std::string>& names) {
  std::string text = "(";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    text += (d ? ", " : "") + (d < names.size() ? names[d] + "=" : std::string()) + std::to_string(shape[d]);
  }
  return text + ")";
}
}  // namespace

device_mesh::device_mesh(const process_group& world, std::vector<int> shape, std::vector<std::string> names)
    : shape_(std::move(shape)), names_(std::move(names)) {
  if (shape_.empty() || shape_.size() != names_.size()) {
    throw configuration_error("device_mesh: " + std::to_string(shape_.size()) + " dimensions but " +
                              std::to_string(names_.size()) + " names; give one name per dimension");
  }
  for (std::size_t d = 0; d < names_.size(); ++d) {
    if (shape_[d] < 1) throw configuration_error("device_mesh: every dimension needs size >= 1, got " +
                                                 shape_text(shape_, names_));
    if (std::count(names_.begin(), names_.end(), names_[d]) != 1) {
      throw configuration_error("device_mesh: the dimension name '" + names_[d] + "' is used twice");
    }
  }
  const long product = std::accumulate(shape_.begin(), shape_.end(), 1L, std::multiplies<long>());
  if (product != world.size()) {
    throw configuration_error("device_mesh: the mesh " + shape_text(shape_, names_) + " has " +
                              std::to_string(product) + " ranks, but the world has " + std::to_string(world.size()) +
                              "; the sizes must multiply to the world size");
  }
  const int ndim = static_cast<int>(shape_.size());
  std::vector<int> strides(static_cast<std::size_t>(ndim), 1);
  for (int d = ndim - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape_[d + 1];
  coordinates_.resize(static_cast<std::size_t>(ndim));
  for (int d = 0; d < ndim; ++d) coordinates_[d] = (world.rank() / strides[d]) % shape_[d];

  groups_.resize(static_cast<std::size_t>(ndim));
  for (int d = 0; d < ndim; ++d) {
    if (shape_[d] == 1) continue;  // a group of one: local no-op collectives, nothing to create
    // Every line along d, in order of its lowest rank: a rank r lies at the
    // start of a line when its coordinate along d is 0.
    for (int start = 0; start < world.size(); ++start) {
      if ((start / strides[d]) % shape_[d] != 0) continue;
      std::vector<int> line;
      for (int k = 0; k < shape_[d]; ++k) line.push_back(start + k * strides[d]);
      process_group group = world.new_group(line);
      if (group.valid()) groups_[d] = std::move(group);
    }
  }
}

int device_mesh::dimension(std::string_view name) const {
  for (std::size_t d = 0; d < names_.size(); ++d) {
    if (names_[d] == name) return static_cast<int>(d);
  }
  std::string known;
  for (const auto& n : names_) known += (known.empty() ? "" : ", ") + n;
  throw configuration_error("device_mesh: no dimension named '" + std::string(name) + "'; this mesh has " +
                            (known.empty() ? std::string("none") : known));
}

}  // namespace loom::comm
