#include <gtest/gtest.h>

#include "kolos/core/error.h"
#include "kolos/core/placement.h"

namespace kolos {
namespace {

TEST(Placement, ReplicatedIsWhole) {
  Placement p = Placement::replicated({768, 3072});
  EXPECT_TRUE(p.is_full());
  EXPECT_FALSE(p.has_padding());
  EXPECT_TRUE(p.sharded().empty());
  EXPECT_EQ(p.local_shape(), (std::vector<int64_t>{768, 3072}));
  EXPECT_EQ(p.global_numel(), 768 * 3072);
}

TEST(Placement, ShardPadsTheLastChunksLikeFsdp2) {
  Placement p = Placement::replicated({10, 3});
  // 10 rows over 4 ranks: chunks of 3 -> 3, 3, 3, 1 (padded to 3).
  const int64_t lengths[] = {3, 3, 3, 1};
  for (int64_t i = 0; i < 4; ++i) {
    Placement s = p.shard(0, i, 4, AxisSet{Axis::kDP});
    EXPECT_EQ(s.slice(0).offset, 3 * i);
    EXPECT_EQ(s.slice(0).length, lengths[i]);
    EXPECT_EQ(s.slice(0).padded, 3);
    EXPECT_EQ(s.local_shape(), (std::vector<int64_t>{3, 3}));
    EXPECT_EQ(s.has_padding(), i == 3);
    EXPECT_EQ(s.sharded(), AxisSet{Axis::kDP});
  }
  // 2 rows over 4 ranks: the last two chunks are empty.
  Placement small = Placement::replicated({2}).shard(0, 3, 4, AxisSet{Axis::kDP});
  EXPECT_EQ(small.slice(0).length, 0);
  EXPECT_EQ(small.slice(0).padded, 1);
}

TEST(Placement, ShardsCompose) {
  // Tensor parallel splits columns, then ZeRO shards rows over dp.
  Placement tp = Placement::replicated({8, 6}).split(1, 1, 2, AxisSet{Axis::kTP});
  EXPECT_EQ(tp.slice(1).offset, 3);
  EXPECT_EQ(tp.slice(1).length, 3);
  Placement both = tp.shard(0, 1, 2, AxisSet{Axis::kDP});
  EXPECT_EQ(both.slice(0).offset, 4);
  EXPECT_EQ(both.sharded(), (AxisSet{Axis::kDP, Axis::kTP}));
  EXPECT_EQ(both.piece_numel(), 4 * 3);
  EXPECT_FALSE(both.is_full());
}

TEST(Placement, SplitRequiresEvenParts) {
  EXPECT_THROW(Placement::replicated({10}).split(0, 0, 4, AxisSet{Axis::kTP}), Error);
  EXPECT_THROW(Placement::replicated({10}).shard(1, 0, 2, AxisSet{Axis::kTP}), Error);
  EXPECT_THROW(Placement::replicated({10}).shard(0, 2, 2, AxisSet{Axis::kTP}), Error);
}

TEST(Placement, IntersectGivesTheOverlapForResharding) {
  Placement g = Placement::replicated({12, 4});
  Placement a = g.shard(0, 1, 3, AxisSet{Axis::kDP});  // rows 4..8
  Placement b = g.shard(0, 2, 4, AxisSet{Axis::kDP});  // rows 6..9
  std::vector<DimSlice> overlap;
  ASSERT_TRUE(a.intersect(b, &overlap));
  EXPECT_EQ(overlap[0].offset, 6);
  EXPECT_EQ(overlap[0].length, 2);
  EXPECT_EQ(overlap[1].length, 4);
  Placement c = g.shard(0, 0, 3, AxisSet{Axis::kDP});  // rows 0..4
  EXPECT_FALSE(c.intersect(b, nullptr));
  EXPECT_THROW(a.intersect(Placement::replicated({12, 5}), nullptr), Error);
}

TEST(Placement, OneCanonicalReplicaPerPiece) {
  // tp2 x dp2 (pp, dp, sp, tp): a tp-sharded piece is held by (dp 0, tp t)
  // and (dp 1, tp t); the rank at dp 0 speaks for both.
  const MeshLayout layout(MeshShape{1, 2, 1, 2});
  int canonical = 0;
  for (int64_t rank = 0; rank < layout.world_size(); ++rank) {
    const Coords c = layout.coords(rank);
    const Placement p = Placement::replicated({8, 4}).shard(0, c[3], 2, AxisSet{Axis::kTP});
    EXPECT_EQ(p.is_canonical_replica(c), c[1] == 0) << "rank " << rank;
    canonical += p.is_canonical_replica(c) ? 1 : 0;
    // Asked only about pp, along which this mesh has one rank: every rank.
    EXPECT_TRUE(p.is_canonical_replica(c, AxisSet{Axis::kPP}));
  }
  EXPECT_EQ(canonical, 2);  // one per distinct piece
  // A whole tensor: only the rank at coordinate 0 everywhere.
  EXPECT_TRUE(Placement::replicated({3}).is_canonical_replica(Coords{0, 0, 0, 0}));
  EXPECT_FALSE(Placement::replicated({3}).is_canonical_replica(Coords{0, 0, 0, 1}));
  // Sharded along every axis: every rank holds its own piece.
  const Placement all = Placement::replicated({16}).shard(0, 5, 16, AxisSet::all());
  EXPECT_TRUE(all.is_canonical_replica(Coords{1, 1, 1, 1}));
  // Along pp only (the gradient norm's question under pipelining).
  EXPECT_FALSE(
      Placement::replicated({3}).is_canonical_replica(Coords{1, 0, 0, 0}, AxisSet{Axis::kPP}));
  EXPECT_TRUE(
      Placement::replicated({3}).is_canonical_replica(Coords{0, 1, 0, 1}, AxisSet{Axis::kPP}));
}

TEST(Placement, Describes) {
  Placement p = Placement::replicated({10, 3}).shard(0, 3, 4, AxisSet{Axis::kDP});
  EXPECT_EQ(p.to_string(), "[10, 3] piece [9:10+pad2, 0:3] | sharded dp");
  EXPECT_EQ(shape_string({768, 3072}), "[768, 3072]");
  EXPECT_EQ(shape_string({}), "[]");
}

}  // namespace
}  // namespace kolos
