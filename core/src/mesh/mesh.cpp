#include "kolos/core/mesh.h"

#include <sstream>

#include "kolos/core/comm/mpi.h"
#include "kolos/core/error.h"

namespace kolos {

const char* to_string(Axis axis) {
  switch (axis) {
    case Axis::kPP: return "pp";
    case Axis::kDP: return "dp";
    case Axis::kSP: return "sp";
    case Axis::kTP: return "tp";
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
    case Axis::kPP: return shape_.pp;
    case Axis::kDP: return shape_.dp;
    case Axis::kSP: return shape_.sp;
    case Axis::kTP: return shape_.tp;
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

DeviceMesh::DeviceMesh(MPI_Comm world, MeshShape shape) : layout_(shape) {
  int rank = 0, size = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  if (layout_.world_size() != size) {
    throw ConfigError("the mesh " + layout_.describe() + " has " +
                      std::to_string(layout_.world_size()) + " ranks but the job has " +
                      std::to_string(size));
  }
  rank_ = rank;
  world_ = world;
  coords_ = layout_.coords(rank);
  // Every rank creates the 15 groups in the same order (MPI_Comm_split is
  // collective over `world`): color = the coordinates outside the set.
  for (uint8_t bits = 1; bits < 16; ++bits) {
    AxisSet axes(bits);
    int64_t color = 0;
    for (int i = 0; i < kNumAxes; ++i) {
      if (!axes.contains(static_cast<Axis>(i))) {
        color = color * layout_.size(static_cast<Axis>(i)) + coords_[i];
      }
    }
    int key = static_cast<int>(layout_.index_in_group(rank, axes));
    MPI_Comm split = MPI_COMM_NULL;
    int rc = MPI_Comm_split(world, static_cast<int>(color), key, &split);
    if (rc != MPI_SUCCESS) throw CommError("MPI_Comm_split for mesh group " + axes.to_string());
    groups_[bits] = comm::make_mpi_process_group(split, axes.to_string());
    MPI_Comm_free(&split);  // the group holds its own duplicate
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
  MPI_Comm sub = MPI_COMM_NULL;
  const int64_t full_color = outside * layout_.size(axes) + color;
  int rc = MPI_Comm_split(world_, static_cast<int>(full_color), static_cast<int>(key), &sub);
  if (rc != MPI_SUCCESS) throw CommError("MPI_Comm_split for mesh sub-group " + name);
  auto group = comm::make_mpi_process_group(sub, name);
  MPI_Comm_free(&sub);
  extra_groups_.push_back(group);
  return group;
}

const comm::ProcessGroupPtr& DeviceMesh::group(AxisSet axes) const {
  KOLOS_CHECK(!axes.empty(), "a mesh group needs at least one axis");
  return groups_[axes.bits()];
}

}  // namespace kolos
