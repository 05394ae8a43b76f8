// Mesh layout: the arithmetic of the device mesh, without MPI or LibTorch.
//
// The mesh's axes are named and registered (AxisInfo): the four of the core,
// outermost first pp, dp, sp, tp; the expert axis ep (expert_axis(), between
// dp and sp), registered at start-up so that every kolos program reads a
// checkpoint written on it; and any axis a plugin or a test registers with
// register_axis(), placed among them by its `order`. The rank of coordinates is row-major over the axes in order, so
// with only the core's axes (p, d, s, t) is ((p*DP + d)*SP + s)*TP + t:
// tensor-parallel peers are consecutive ranks (the same node under a block
// mapping) and pipeline stages are farthest apart. An axis of size 1 takes
// no part in the arithmetic, so registering one changes no existing mesh.
// MeshShape holds the sizes, MeshLayout answers coordinates and groups;
// DeviceMesh (mesh.h) adds the process groups.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace kolos {

enum class Axis : int { kPP = 0, kDP = 1, kSP = 2, kTP = 3 };
// The core's axes; registered axes take the ids after them.
inline constexpr int kCoreAxes = 4;
// At most this many axes, registered ones included (an AxisSet is 8 bits).
inline constexpr int kMaxAxes = 8;
// The number of distinct AxisSets (index: AxisSet::bits()).
inline constexpr int kAxisSets = 1 << kMaxAxes;

// What the mesh knows of an axis.
struct AxisInfo {
  std::string name;          // "tp"; in group names, checkpoints and messages
  int order = 0;             // place in the rank order: smaller is outer
  bool within_node = false;  // its groups should not cross nodes (checked by topology)
  // Ranks that differ along it read different samples, as along dp: the
  // batch is split over dp and every such axis (batch_axes()).
  bool splits_batch = false;
};

// Registers an axis once per process: the same name again with the same
// order and locality returns the same axis; a different order or locality,
// an order another axis has, a name that is not [a-z][a-z0-9_]*, or a ninth
// axis is an Error. Call it before any mesh that uses the axis is built.
// The core's axes: pp 100, dp 200, sp 300, tp 400 (sp and tp within a node).
Axis register_axis(const std::string& name, int order, bool within_node,
                   bool splits_batch = false);
const AxisInfo& axis_info(Axis axis);
std::optional<Axis> find_axis(const std::string& name);
// Every registered axis, outermost first (sorted by order).
std::vector<Axis> axes_in_order();
const char* to_string(Axis axis);
// The expert axis "ep" (order 250, splits the batch): parallel.expert's
// size. Ranks along it hold different experts of every mixture-of-experts
// layer and read different samples; dp's size is parallel.data / ep.
Axis expert_axis();

// Sizes of the mesh axes: the core's four by name, registered axes through
// of()/set() (1 unless set).
struct MeshShape {
  int64_t pp = 1, dp = 1, sp = 1, tp = 1;
  std::array<int64_t, kMaxAxes - kCoreAxes> registered{1, 1, 1, 1};
  int64_t of(Axis axis) const;
  void set(Axis axis, int64_t size);
  int64_t size() const;  // the product over every axis
  // Ranks that read different samples: dp times every registered axis that
  // splits the batch (ep).
  int64_t batch_ranks() const;
};

// A set of mesh axes, as a bit mask (bit i = Axis i).
class AxisSet {
 public:
  constexpr AxisSet() = default;
  constexpr explicit AxisSet(uint8_t bits) : bits_(bits) {}
  constexpr AxisSet(std::initializer_list<Axis> axes) {
    for (Axis a : axes) bits_ |= static_cast<uint8_t>(1u << static_cast<int>(a));
  }
  // Every axis, registered now or later (the world group's set).
  static constexpr AxisSet all() { return AxisSet(0xFF); }
  constexpr bool contains(Axis a) const { return bits_ & (1u << static_cast<int>(a)); }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr uint8_t bits() const { return bits_; }
  constexpr AxisSet operator|(AxisSet o) const { return AxisSet(bits_ | o.bits_); }
  constexpr AxisSet operator&(AxisSet o) const { return AxisSet(bits_ & o.bits_); }
  constexpr AxisSet without(AxisSet o) const { return AxisSet(bits_ & ~o.bits_); }
  constexpr bool operator==(AxisSet o) const { return bits_ == o.bits_; }
  constexpr bool operator!=(AxisSet o) const { return bits_ != o.bits_; }
  // "dp×sp"; "none" when empty, "world" when it holds every registered axis.
  std::string to_string() const;

 private:
  uint8_t bits_ = 0;
};

// dp and every registered axis that splits the batch: the axes over which
// samples differ and dense gradients are averaged.
AxisSet batch_axes();

// A rank's coordinate along each axis, indexed by the axis's id (0 for
// axes the mesh does not use).
using Coords = std::array<int64_t, kMaxAxes>;

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
  // "pp=1 dp=2 sp=1 tp=1", then registered axes larger than 1 ("ep=2").
  std::string describe() const;

 private:
  MeshShape shape_;
  std::vector<Axis> order_;  // the axes registered when the layout was made, outermost first
};

}  // namespace kolos
