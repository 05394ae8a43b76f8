// DeviceMesh: all parallelism as one grid of ranks with named axes.
//
// The axes and their arithmetic are in mesh_layout.h (MeshShape, MeshLayout:
// testable without MPI). DeviceMesh adds one ProcessGroup per non-empty set
// of axes, all split from the world group at start-up, so no plugin splits
// communicators on its own.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/mesh_layout.h"

namespace kolos {

class DeviceMesh {
 public:
  // Collective over `world`: its groups are split from it. Throws
  // ConfigError when the shape's product differs from the world's size
  // (before any communication).
  DeviceMesh(comm::ProcessGroupPtr world, MeshShape shape);
  ~DeviceMesh();
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  const MeshLayout& layout() const { return layout_; }
  int64_t rank() const { return rank_; }
  int64_t coord(Axis axis) const { return coords_[static_cast<int>(axis)]; }
  int64_t size(Axis axis) const { return layout_.size(axis); }
  // The group of ranks that differ from this one only along `axes`.
  const comm::ProcessGroupPtr& group(AxisSet axes) const;
  const comm::ProcessGroupPtr& group(Axis axis) const { return group(AxisSet{axis}); }
  const comm::ProcessGroupPtr& world() const { return group(AxisSet::all()); }

  // Sub-groups of the group over `axes` (the process grids of 2D/2.5D/3D
  // tensor parallelism): ranks of one such group with equal `color` form a
  // new group, ordered by `key`. Collective over the whole mesh: every rank
  // calls it, in the same order. The mesh keeps the group (see
  // extra_groups(), which traffic accounting reads) and names it `name`.
  comm::ProcessGroupPtr split(AxisSet axes, int64_t color, int64_t key,
                              const std::string& name) const;
  const std::vector<comm::ProcessGroupPtr>& extra_groups() const { return extra_groups_; }

 private:
  MeshLayout layout_;
  int64_t rank_ = 0;
  Coords coords_{};
  // The color of this rank's group over `axes`: its coordinates outside them.
  int64_t outside(AxisSet axes) const;

  AxisSet present_;  // the axes with groups (see the constructor)
  std::array<comm::ProcessGroupPtr, kAxisSets> groups_;  // index: AxisSet bits
  comm::ProcessGroupPtr self_;  // for sets of unused registered axes
  mutable std::vector<comm::ProcessGroupPtr> extra_groups_;
  comm::ProcessGroupPtr world_;  // the group the mesh was split from
};

}  // namespace kolos
