#include "kolos/core/mesh_layout.h"

#include <sstream>

#include "kolos/core/error.h"

namespace kolos {

const char* to_string(Axis axis) {
  switch (axis) {
    case Axis::kPP:
      return "pp";
    case Axis::kDP:
      return "dp";
    case Axis::kSP:
      return "sp";
    case Axis::kTP:
      return "tp";
  }
  return "?";
}

std::string AxisSet::to_string() const {
  if (empty()) return "none";
  if (bits_ == 0xF) return "world";
  std::string out;
  for (int i = 0; i < kNumAxes; ++i) {
    if (!contains(static_cast<Axis>(i))) continue;
    if (!out.empty()) out += "×";
    out += kolos::to_string(static_cast<Axis>(i));
  }
  return out;
}

MeshLayout::MeshLayout(MeshShape shape) : shape_(shape) {
  for (int64_t s : {shape.pp, shape.dp, shape.sp, shape.tp}) {
    KOLOS_CHECK_KIND(kConfig, s >= 1, "mesh axis sizes must be >= 1, got ", describe());
  }
}

int64_t MeshLayout::size(Axis axis) const {
  switch (axis) {
    case Axis::kPP:
      return shape_.pp;
    case Axis::kDP:
      return shape_.dp;
    case Axis::kSP:
      return shape_.sp;
    case Axis::kTP:
      return shape_.tp;
  }
  return 1;
}

int64_t MeshLayout::size(AxisSet axes) const {
  int64_t n = 1;
  for (int i = 0; i < kNumAxes; ++i) {
    if (axes.contains(static_cast<Axis>(i))) n *= size(static_cast<Axis>(i));
  }
  return n;
}

Coords MeshLayout::coords(int64_t rank) const {
  KOLOS_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " outside mesh ", describe());
  Coords c{};
  for (int i = kNumAxes - 1; i >= 0; --i) {
    int64_t n = size(static_cast<Axis>(i));
    c[i] = rank % n;
    rank /= n;
  }
  return c;
}

int64_t MeshLayout::rank_of(const Coords& c) const {
  int64_t rank = 0;
  for (int i = 0; i < kNumAxes; ++i) {
    int64_t n = size(static_cast<Axis>(i));
    KOLOS_CHECK(c[i] >= 0 && c[i] < n, "coordinate ", c[i], " outside axis ",
                to_string(static_cast<Axis>(i)), " of size ", n);
    rank = rank * n + c[i];
  }
  return rank;
}

std::vector<int64_t> MeshLayout::group_ranks(int64_t rank, AxisSet axes) const {
  Coords base = coords(rank);
  std::vector<int64_t> ranks;
  ranks.reserve(size(axes));
  // Row-major over the axes in the set (outermost first).
  for (int64_t index = 0; index < size(axes); ++index) {
    Coords c = base;
    int64_t rest = index;
    for (int i = kNumAxes - 1; i >= 0; --i) {
      if (!axes.contains(static_cast<Axis>(i))) continue;
      int64_t n = size(static_cast<Axis>(i));
      c[i] = rest % n;
      rest /= n;
    }
    ranks.push_back(rank_of(c));
  }
  return ranks;
}

int64_t MeshLayout::index_in_group(int64_t rank, AxisSet axes) const {
  Coords c = coords(rank);
  int64_t index = 0;
  for (int i = 0; i < kNumAxes; ++i) {
    if (axes.contains(static_cast<Axis>(i))) index = index * size(static_cast<Axis>(i)) + c[i];
  }
  return index;
}

std::string MeshLayout::describe() const {
  std::ostringstream out;
  out << "pp=" << shape_.pp << " dp=" << shape_.dp << " sp=" << shape_.sp << " tp=" << shape_.tp;
  return out.str();
}

}  // namespace kolos
