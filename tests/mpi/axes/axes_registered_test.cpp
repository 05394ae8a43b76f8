// A mesh axis registered from a test, as a plugin would register its own
// (an expert axis): "ex", between dp and sp in the rank order, and "lane",
// innermost and registered as within a node. Nothing under core/ names
// either; the mesh, its process groups, placements, the checkpoint's layout
// and topology's locality check follow the registration. 4 ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/error.h"
#include "kolos/core/layer_factory.h"
#include "kolos/core/mesh.h"
#include "kolos/core/placement.h"
#include "kolos/topology/locality.h"

namespace kolos {
namespace {

using testing::first_ranks;
using testing::shared_tmpdir;
using testing::world_group;
using testing::world_rank;

const Axis kEx = register_axis("ex", 270, /*within_node=*/false);
const Axis kLane = register_axis("lane", 500, /*within_node=*/true);

MeshShape with_ex(int64_t dp, int64_t ex) {
  MeshShape s;
  s.dp = dp;
  s.set(kEx, ex);
  return s;
}

TEST(RegisteredAxis, HasItsPlaceInTheRankOrder) {
  EXPECT_EQ(find_axis("ex"), kEx);
  EXPECT_EQ(axis_info(kEx).order, 270);
  EXPECT_EQ(register_axis("ex", 270, false), kEx);  // again, the same: the same axis
  EXPECT_THROW(register_axis("ex", 280, false), Error);
  EXPECT_THROW(register_axis("other", 270, false), Error);  // ex's order
  EXPECT_THROW(register_axis("Bad-Name", 600, false), Error);
  const std::vector<Axis> order = axes_in_order();
  // ep (250) is registered at start-up; ex takes 270, after it.
  const std::vector<Axis> expected{Axis::kPP, Axis::kDP, expert_axis(), kEx,
                                   Axis::kSP, Axis::kTP,  kLane};
  EXPECT_EQ(order, expected);

  // dp 2 x ex 2 x tp... : rank = (d * EX + e) * TP + t.
  MeshShape s = with_ex(2, 2);
  s.tp = 2;
  const MeshLayout layout(s);
  EXPECT_EQ(layout.world_size(), 8);
  EXPECT_EQ(layout.describe(), "pp=1 dp=2 sp=1 tp=2 ex=2");
  EXPECT_EQ(layout.coords(6)[static_cast<int>(Axis::kDP)], 1);
  EXPECT_EQ(layout.coords(6)[static_cast<int>(kEx)], 1);
  EXPECT_EQ(layout.coords(6)[static_cast<int>(Axis::kTP)], 0);
  EXPECT_EQ(layout.group_ranks(5, AxisSet{kEx}), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(layout.group_ranks(5, AxisSet{Axis::kDP}), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(layout.group_ranks(0, AxisSet{Axis::kDP, kEx}), (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ((AxisSet{Axis::kDP, kEx}).to_string(), "dp×ex");
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(layout.rank_of(layout.coords(r)), r);
  EXPECT_THROW(MeshLayout(with_ex(1, 0)), ConfigError);
}

TEST(RegisteredAxis, BuildsItsProcessGroups) {
  // 4 ranks: dp 2 x ex 2.
  DeviceMesh mesh(world_group(), with_ex(2, 2));
  const int64_t r = mesh.rank();
  EXPECT_EQ(mesh.coord(kEx), r % 2);
  EXPECT_EQ(mesh.coord(Axis::kDP), r / 2);
  EXPECT_EQ(mesh.group(kEx)->size(), 2);
  EXPECT_EQ(mesh.group(kEx)->name(), "ex");
  EXPECT_EQ(mesh.group(AxisSet{Axis::kDP, kEx})->size(), 4);
  EXPECT_EQ(mesh.world()->size(), 4);
  // A sum over each group: the members' world ranks.
  auto sum_over = [&](AxisSet axes) {
    at::Tensor v = torch::tensor({static_cast<double>(r)}, torch::kDouble);
    mesh.group(axes)->all_reduce(v, comm::ReduceOp::kSum)->wait();
    return v.item<double>();
  };
  EXPECT_EQ(sum_over(AxisSet{kEx}), r % 2 == 0 ? 2 * r + 1 : 2 * r - 1);  // {r, r^1}
  EXPECT_EQ(sum_over(AxisSet{Axis::kDP}), (r % 2) * 2 + 2);                // {e, 2 + e}
  EXPECT_EQ(sum_over(AxisSet::all()), 6);
  // An axis of size 1 in this mesh (lane) adds nothing to a set.
  EXPECT_EQ(mesh.group(AxisSet{kEx, kLane})->size(), 2);
  EXPECT_EQ(mesh.group(kLane)->size(), 1);
}

// A [10, 3] tensor cut along dim 0 over ex (padded: 5 rows each of 2
// parts), replicated over dp; and a [6] one cut over dp x ex.
std::vector<checkpoint::Piece> pieces(const MeshLayout& layout, int64_t rank, bool filled,
                                      AxisSet rows_over, AxisSet flat_over) {
  const at::Tensor a = torch::arange(30, torch::kFloat).reshape({10, 3}) * 0.5;
  const at::Tensor b = torch::arange(6, torch::kDouble) + 100;
  const Placement pa = Placement::replicated({10, 3}).shard(
      0, layout.index_in_group(rank, rows_over), layout.size(rows_over), rows_over);
  const Placement pb = Placement::replicated({6}).shard(
      0, layout.index_in_group(rank, flat_over), layout.size(flat_over), flat_over);
  auto local = [&](const at::Tensor& global, const Placement& p) {
    return filled ? local_piece(global, p) : torch::full(p.local_shape(), -1, global.options());
  };
  return {{"model/a", local(a, pa), pa}, {"model/b", local(b, pb), pb}};
}

TEST(RegisteredAxis, CheckpointSavedAcrossItReadsUnderOtherMeshes) {
  const std::string dir = shared_tmpdir("axes") + "/ckpt";
  const MeshShape writing = with_ex(2, 2);
  {
    auto group = world_group();
    checkpoint::Metadata meta;
    meta.step = 7;
    meta.mesh = writing;
    meta.world_size = 4;
    const MeshLayout layout(writing);
    checkpoint::save_pieces(*group, layout, dir,
                            pieces(layout, world_rank(), true, AxisSet{kEx},
                                   AxisSet{Axis::kDP, kEx}),
                            meta);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const at::Tensor a = torch::arange(30, torch::kFloat).reshape({10, 3}) * 0.5;
  const at::Tensor b = torch::arange(6, torch::kDouble) + 100;
  if (world_rank() == 0) {
    const auto info = checkpoint::inspect(dir);
    EXPECT_EQ(info.meta.mesh.of(kEx), 2);
    EXPECT_EQ(info.meta.mesh.dp, 2);
    EXPECT_EQ(info.meta.world_size, 4);
    EXPECT_NE(checkpoint::format_inspection(info).find("ex=2"), std::string::npos)
        << checkpoint::format_inspection(info);
    EXPECT_TRUE(checkpoint::verify(dir).empty());
  }
  // Serial: the whole tensors.
  {
    auto self = testing::self_group();
    const MeshLayout serial{MeshShape{}};
    auto read = pieces(serial, 0, false, AxisSet{}, AxisSet{});
    EXPECT_EQ(checkpoint::load_pieces(*self, dir, read).step, 7);
    EXPECT_TRUE(torch::equal(read[0].tensor, a));
    EXPECT_TRUE(torch::equal(read[1].tensor, b));
  }
  // ex 4: four parts of each along ex (the last part of a padded).
  {
    auto group = world_group();
    const MeshLayout ex4(with_ex(1, 4));
    auto read = pieces(ex4, world_rank(), false, AxisSet{kEx}, AxisSet{kEx});
    checkpoint::load_pieces(*group, dir, read);
    for (const auto& p : read) {
      const at::Tensor global = p.name == "model/a" ? a : b;
      EXPECT_TRUE(torch::equal(p.tensor, local_piece(global, p.placement)))
          << p.name << " " << p.placement.to_string() << " on rank " << world_rank();
    }
  }
  // No ex at all: dp 4.
  {
    auto group = world_group();
    const MeshLayout dp4(with_ex(4, 1));
    auto read = pieces(dp4, world_rank(), false, AxisSet{Axis::kDP}, AxisSet{Axis::kDP});
    checkpoint::load_pieces(*group, dir, read);
    for (const auto& p : read) {
      const at::Tensor global = p.name == "model/a" ? a : b;
      EXPECT_TRUE(torch::equal(p.tensor, local_piece(global, p.placement)))
          << p.name << " " << p.placement.to_string() << " on rank " << world_rank();
    }
  }
}

TEST(RegisteredAxis, WithinNodeAxisIsCheckedByTopology) {
  // lane 2 innermost, two hosts of two ranks: each lane group is one host.
  MeshShape s;
  s.dp = 2;
  s.set(kLane, 2);
  const std::vector<std::string> two_by_two{"n0", "n0", "n1", "n1"};
  EXPECT_TRUE(topology::check_locality(s, two_by_two).findings.empty());
  // Hosts alternating: every lane group crosses nodes, and strict refuses it.
  const std::vector<std::string> alternating{"n0", "n1", "n0", "n1"};
  const auto report = topology::check_locality(s, alternating);
  ASSERT_EQ(report.findings.size(), 2u);
  EXPECT_EQ(report.findings[0].axis, "lane");
  EXPECT_TRUE(report.findings[0].crosses_nodes);
  EXPECT_THROW(topology::check_locality(s, alternating, {}, /*strict=*/true), ConfigError);
  // ex is not registered within a node: not checked.
  EXPECT_TRUE(topology::check_locality(with_ex(2, 2), alternating).findings.empty());
}

}  // namespace
}  // namespace kolos
