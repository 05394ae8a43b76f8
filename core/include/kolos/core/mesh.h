// DeviceMesh: all parallelism as one grid of ranks with named axes.
//
// Axes, outermost first: pp, dp, sp, tp. The rank of coordinates
// (p, d, s, t) is ((p*DP + d)*SP + s)*TP + t, so tensor-parallel peers are
// consecutive ranks (the same node under a block mapping) and pipeline stages
// are farthest apart. MeshLayout is the pure arithmetic (testable without
// MPI); DeviceMesh adds one ProcessGroup per non-empty set of axes, all built
// at start-up, so no plugin splits communicators on its own.
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/run_config.h"

namespace kolos {

enum class Axis : int { kPP = 0, kDP = 1, kSP = 2, kTP = 3 };
inline constexpr int kNumAxes = 4;
const char* to_string(Axis axis);

// A set of mesh axes, as a bit mask (bit i = Axis i).
class AxisSet {
 public:
  constexpr AxisSet() = default;
  constexpr explicit AxisSet(uint8_t bits) : bits_(bits & 0xF) {}
  constexpr AxisSet(std::initializer_list<Axis> axes) {
    for (Axis a : axes) bits_ |= static_cast<uint8_t>(1u << static_cast<int>(a));
  }
  static constexpr AxisSet all() { return AxisSet(0xF); }
  constexpr bool contains(Axis a) const { return bits_ & (1u << static_cast<int>(a)); }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr uint8_t bits() const { return bits_; }
  constexpr AxisSet operator|(AxisSet o) const { return AxisSet(bits_ | o.bits_); }
  constexpr AxisSet operator&(AxisSet o) const { return AxisSet(bits_ & o.bits_); }
  constexpr AxisSet without(AxisSet o) const { return AxisSet(bits_ & ~o.bits_); }
  constexpr bool operator==(AxisSet o) const { return bits_ == o.bits_; }
  constexpr bool operator!=(AxisSet o) const { return bits_ != o.bits_; }
  // "dp×sp"; "none" when empty.
  std::string to_string() const;

 private:
  uint8_t bits_ = 0;
};

using Coords = std::array<int64_t, kNumAxes>;

class MeshLayout {
 public:
  explicit MeshLayout(MeshShape shape);
  const MeshShape& shape() const { return shape_; }
  int64_t size(Axis axis) const;
  int64_t size(AxisSet axes) const;  // product of the axes' sizes
  int64_t world_size() const { return shape_.size(); }
  Coords coords(int64_t rank) const;
  int64_t rank_of(const Coords& coords) const;
  // The world ranks that share all coordinates of `rank` except those in
  // `axes`, in increasing order of their index within the group.
  std::vector<int64_t> group_ranks(int64_t rank, AxisSet axes) const;
  // This rank's index within its group over `axes` (row-major over the axes).
  int64_t index_in_group(int64_t rank, AxisSet axes) const;
  std::string describe() const;  // "pp=1 dp=2 sp=1 tp=1"

 private:
  MeshShape shape_;
};

class DeviceMesh {
 public:
  // Collective over `world`. Throws ConfigError when the shape's product
  // differs from the world size (before any other communication).
  DeviceMesh(MPI_Comm world, MeshShape shape);
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
  std::array<comm::ProcessGroupPtr, 16> groups_;  // index: AxisSet bits
  mutable std::vector<comm::ProcessGroupPtr> extra_groups_;
  MPI_Comm world_ = MPI_COMM_NULL;  // not owned; outlives the mesh
};

}  // namespace kolos
