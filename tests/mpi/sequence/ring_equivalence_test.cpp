// Sequence parallelism, mode "ring" (ring attention, zigzag placement),
// against the serial run of the same model, seed and data: per-step losses
// within 1e-5 relative, every step's global gradient norm within 1e-4
// relative and the final gathered parameters within 5e-5 absolute
// (testing::Tolerance).
//
// The tiny GPT has 16 positions: a rank of sp 2 holds chunks r and 3-r of 4
// (positions 0-3 and 12-15 on rank 0), of sp 4 chunks r and 7-r of 8, so
// its learned positions or rotary angles, its slice of the targets and the
// causal mask across the ring all matter from the first step. Runs are 8
// steps with clipping active (optim.grad_clip = 0.05), as in
// sequence_equivalence_test.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "equivalence.h"
#include "sequence_cases.h"

namespace kolos {
namespace {

// sp ranks of mode ring (x whatever else `overrides` sets).
RunConfig ring(int sp, std::vector<std::string> overrides = {}) {
  return testing::sequence::mode("ring", sp, std::move(overrides));
}

TEST(Ring, MatchesSerial) {
  // sp 2 at 2 ranks, sp 4 at 4.
  REQUIRE_RANKS(2, 4);
  testing::expect_equivalent(serial(), ring(world_size(), {"parallel.data=1"}));
}

TEST(Ring, HeadsThatDoNotDivideBySequenceSize) {
  // 2 heads over sp 4: every rank keeps all its heads (ulysses refuses this).
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial({"model.heads=2"}), ring(4, {"model.heads=2"}));
}

TEST(Ring, WithDataParallelMatchesSerial) {
  // sp 2 x dp 2, each dp rank 2 micro-batches of 4.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), ring(2, {"parallel.data=2"}));
}

TEST(Ring, WithZero3MatchesSerial) {
  // sp 2 x dp 2 under ZeRO-3: parameters sharded over the 4 ranks of dp x sp.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), ring(2, {"parallel.data=2", "parallel.zero.stage=3"}));
}

TEST(Ring, WithTp1dMatchesSerial) {
  // sp 2 x tp 2: each tensor rank's 2 heads go around the sp ring.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(),
                             ring(2, {"parallel.tensor.size=2", "parallel.tensor.mode=\"1d\""}));
}

TEST(Ring, WithThePipelineMatchesSerial) {
  // sp 2 x 2 stages, 1F1B over 4 micro-batches: each stage's sp pair runs
  // its rings for the micro-batches in the schedule's order, forward and
  // backward interleaved; stages cut by measured time, whose probe runs
  // whole samples outside the sp group.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(
      serial(), ring(2, {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\"",
                         "parallel.pipeline.balance=\"time\""}));
}

TEST(Ring, WithRecomputeMatchesSerial) {
  // "selective" recomputes nothing under ring (the kernel keeps no T x T
  // scores to drop; ring.cpp); "full" re-runs whole blocks in backward, the
  // forward ring included.
  REQUIRE_RANKS(2);
  testing::expect_equivalent(serial(), ring(2, {"train.recompute=\"selective\""}));
  testing::expect_equivalent(serial(), ring(2, {"train.recompute=\"full\""}));
}

TEST(RingLlama, GroupedQueryAttentionMatchesSerial) {
  // 8 query heads, 2 key/value heads, repeated to 8 before the ring; RoPE
  // angles follow each rank's two zigzag chunks.
  REQUIRE_RANKS(2, 4);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  testing::expect_equivalent(serial(llama(gqa)), ring(world_size(), llama(gqa)));
}

TEST(RingLlama, WithThePipelineAndGqaMatchesSerial) {
  // sp 2 x 2 stages: the untied LM head and its loss on the last stage.
  REQUIRE_RANKS(4);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  std::vector<std::string> mix = llama(gqa);
  mix.insert(mix.end(), {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""});
  testing::expect_equivalent(serial(llama(gqa)), ring(2, mix));
}

TEST(Ring, SequenceTimesDataEqualsDataOnlyOfTheSameBatch) {
  // The loss of a ring sp 2 x dp 2 run is the mean over the whole global
  // batch, as the dp 4 run's is: not scaled by sp.
  REQUIRE_RANKS(4);
  const RunConfig dp_only = testing::tiny_gpt_config(base({"parallel.data=4"}));
  const RunConfig mixed = ring(2, {"parallel.data=2"});
  ASSERT_EQ(dp_only.train.global_batch, mixed.train.global_batch);
  const auto group = testing::world_group();
  const testing::RunRecord a = testing::run_and_record(dp_only, group);
  const testing::RunRecord b = testing::run_and_record(mixed, group);
  testing::expect_records_match(a, b, testing::Tolerance{}, "ring sp2 x dp2 vs dp4");
}

}  // namespace
}  // namespace kolos
