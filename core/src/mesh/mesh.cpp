#include "kolos/core/mesh.h"

#include <string>

#include "kolos/core/error.h"

namespace kolos {

DeviceMesh::DeviceMesh(comm::ProcessGroupPtr world, MeshShape shape)
    : layout_(shape), world_(std::move(world)) {
  KOLOS_CHECK(world_ != nullptr, "a device mesh needs a world group");
  const int rank = world_->rank();
  const int size = world_->size();
  if (layout_.world_size() != size) {
    throw ConfigError("the mesh " + layout_.describe() + " has " +
                      std::to_string(layout_.world_size()) + " ranks but the job has " +
                      std::to_string(size));
  }
  rank_ = rank;
  coords_ = layout_.coords(rank);
  // The axes with groups: the core's four, and registered axes the shape
  // uses (larger than 1). A set's other axes (registered, of size 1) add
  // nothing to it: group() looks the set up without them.
  const std::vector<Axis> order = axes_in_order();
  for (Axis a : order) {
    if (static_cast<int>(a) < kCoreAxes || layout_.size(a) > 1) present_ = present_ | AxisSet{a};
  }
  // Every rank creates the groups in the same order (a split is collective
  // over the world): one per non-empty subset of the present axes (15 with
  // the core's four), color = the coordinates outside the set.
  for (int bits = 1; bits < kAxisSets; ++bits) {
    const AxisSet axes(static_cast<uint8_t>(bits));
    if (axes.without(present_) != AxisSet{}) continue;
    groups_[bits] = world_->split(outside(axes), layout_.index_in_group(rank, axes),
                                  axes == present_ ? "world" : axes.to_string());
  }
  // A set of unused axes only: this rank alone.
  if (order.size() > static_cast<size_t>(kCoreAxes)) {
    self_ = world_->split(rank, 0, "self");
  }
}

int64_t DeviceMesh::outside(AxisSet axes) const {
  int64_t color = 0;
  for (Axis a : axes_in_order()) {
    if (!axes.contains(a)) color = color * layout_.size(a) + coords_[static_cast<int>(a)];
  }
  return color;
}

DeviceMesh::~DeviceMesh() = default;

comm::ProcessGroupPtr DeviceMesh::split(AxisSet axes, int64_t color, int64_t key,
                                        const std::string& name) const {
  KOLOS_CHECK(color >= 0 && color < layout_.size(axes), "mesh split of ", axes.to_string(),
              ": color ", color, " outside [0, ", layout_.size(axes), ")");
  // Groups over `axes` are told apart by the coordinates outside them.
  const int64_t outside = this->outside(axes);
  auto group = world_->split(outside * layout_.size(axes) + color, key, name);
  extra_groups_.push_back(group);
  return group;
}

const comm::ProcessGroupPtr& DeviceMesh::group(AxisSet axes) const {
  KOLOS_CHECK(!axes.empty(), "a mesh group needs at least one axis");
  const AxisSet used = axes & present_;
  if (used.empty()) {
    KOLOS_CHECK(self_ != nullptr, "no mesh group over ", axes.to_string());
    return self_;
  }
  return groups_[used.bits()];
}

}  // namespace kolos
