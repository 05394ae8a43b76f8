#include <gtest/gtest.h>

#include <set>

#include "kolos/core/error.h"
#include "kolos/core/mesh.h"

namespace kolos {
namespace {

MeshShape shape(int64_t pp, int64_t dp, int64_t sp, int64_t tp) {
  MeshShape s;
  s.pp = pp, s.dp = dp, s.sp = sp, s.tp = tp;
  return s;
}

TEST(MeshLayout, TensorParallelIsInnermost) {
  MeshLayout layout(shape(2, 2, 1, 2));  // 8 ranks
  EXPECT_EQ(layout.world_size(), 8);
  EXPECT_EQ(layout.coords(0), (Coords{0, 0, 0, 0}));
  EXPECT_EQ(layout.coords(1), (Coords{0, 0, 0, 1}));
  EXPECT_EQ(layout.coords(2), (Coords{0, 1, 0, 0}));
  EXPECT_EQ(layout.coords(5), (Coords{1, 0, 0, 1}));
  EXPECT_EQ(layout.coords(7), (Coords{1, 1, 0, 1}));
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(layout.rank_of(layout.coords(r)), r);
}

TEST(MeshLayout, GroupsPartitionTheWorld) {
  for (MeshShape s : {shape(1, 4, 1, 1), shape(2, 2, 1, 2), shape(1, 2, 3, 2), shape(3, 1, 2, 2)}) {
    MeshLayout layout(s);
    for (uint8_t bits = 1; bits < 16; ++bits) {
      AxisSet axes(bits);
      std::set<int64_t> seen;
      for (int64_t r = 0; r < layout.world_size(); ++r) {
        auto group = layout.group_ranks(r, axes);
        ASSERT_EQ(static_cast<int64_t>(group.size()), layout.size(axes)) << axes.to_string();
        // r is in its own group, at its index, and every member agrees on the group.
        EXPECT_EQ(group.at(layout.index_in_group(r, axes)), r);
        for (int64_t member : group) EXPECT_EQ(layout.group_ranks(member, axes), group);
        // Members differ from r only along the axes of the set.
        for (int64_t member : group) {
          for (int a = 0; a < kMaxAxes; ++a) {
            if (!axes.contains(static_cast<Axis>(a))) {
              EXPECT_EQ(layout.coords(member)[a], layout.coords(r)[a]);
            }
          }
        }
        seen.insert(group.front());
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), layout.world_size() / layout.size(axes));
    }
  }
}

TEST(MeshLayout, DpGroupOfEightRanks) {
  MeshLayout layout(shape(2, 2, 1, 2));
  EXPECT_EQ(layout.group_ranks(5, AxisSet{Axis::kDP}), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(layout.group_ranks(5, AxisSet{Axis::kTP}), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(layout.group_ranks(5, AxisSet{Axis::kPP}), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(layout.group_ranks(0, AxisSet{Axis::kDP, Axis::kTP}),
            (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(MeshLayout, RejectsBadSizesAndRanks) {
  EXPECT_THROW(MeshLayout(shape(1, 0, 1, 1)), ConfigError);
  MeshLayout layout(shape(1, 2, 1, 1));
  EXPECT_THROW(layout.coords(2), Error);
  EXPECT_THROW(layout.rank_of(Coords{0, 2, 0, 0}), Error);
}

TEST(AxisSet, Names) {
  EXPECT_EQ((AxisSet{Axis::kDP, Axis::kSP}).to_string(), "dp×sp");
  EXPECT_EQ(AxisSet().to_string(), "none");
  EXPECT_EQ(AxisSet::all().to_string(), "world");
  EXPECT_TRUE((AxisSet{Axis::kTP}).contains(Axis::kTP));
  EXPECT_FALSE((AxisSet{Axis::kTP}).contains(Axis::kDP));
}

}  // namespace
}  // namespace kolos
