// Mesh layout: the arithmetic of the device mesh, without MPI or LibTorch.
//
// Axes, outermost first: pp, dp, sp, tp. The rank of coordinates
// (p, d, s, t) is ((p*DP + d)*SP + s)*TP + t, so tensor-parallel peers are
// consecutive ranks (the same node under a block mapping) and pipeline stages
// are farthest apart. MeshShape holds the four sizes, MeshLayout answers
// coordinates and groups; DeviceMesh (mesh.h) adds the process groups.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace kolos {

// Sizes of the mesh axes, in mesh order pp, dp, sp, tp.
struct MeshShape {
  int64_t pp = 1, dp = 1, sp = 1, tp = 1;
  int64_t size() const { return pp * dp * sp * tp; }
};

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

}  // namespace kolos
