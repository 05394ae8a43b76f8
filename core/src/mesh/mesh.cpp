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
  // Every rank creates the 15 groups in the same order (a split is
  // collective over the world): color = the coordinates outside the set.
  for (uint8_t bits = 1; bits < 16; ++bits) {
    AxisSet axes(bits);
    int64_t color = 0;
    for (int i = 0; i < kNumAxes; ++i) {
      if (!axes.contains(static_cast<Axis>(i))) {
        color = color * layout_.size(static_cast<Axis>(i)) + coords_[i];
      }
    }
    groups_[bits] = world_->split(color, layout_.index_in_group(rank, axes), axes.to_string());
  }
}

DeviceMesh::~DeviceMesh() = default;

comm::ProcessGroupPtr DeviceMesh::split(AxisSet axes, int64_t color, int64_t key,
                                        const std::string& name) const {
  KOLOS_CHECK(color >= 0 && color < layout_.size(axes), "mesh split of ", axes.to_string(),
              ": color ", color, " outside [0, ", layout_.size(axes), ")");
  // Groups over `axes` are told apart by the coordinates outside them.
  int64_t outside = 0;
  for (int i = 0; i < kNumAxes; ++i) {
    if (!axes.contains(static_cast<Axis>(i))) {
      outside = outside * layout_.size(static_cast<Axis>(i)) + coords_[i];
    }
  }
  auto group = world_->split(outside * layout_.size(axes) + color, key, name);
  extra_groups_.push_back(group);
  return group;
}

const comm::ProcessGroupPtr& DeviceMesh::group(AxisSet axes) const {
  KOLOS_CHECK(!axes.empty(), "a mesh group needs at least one axis");
  return groups_[axes.bits()];
}

}  // namespace kolos
