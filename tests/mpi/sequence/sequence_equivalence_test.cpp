// Sequence parallelism (parallel.sequence, mode "ulysses") against the serial
// run of the same model, seed and data: per-step losses within 1e-5
// relative, every step's global gradient norm within 1e-4 relative and the
// final gathered parameters within 5e-5 absolute (testing::Tolerance).
//
// The tiny GPT has 4 heads and 16 positions; a rank of sp 2 holds 8 of them,
// of sp 4 holds 4, so its learned positions, its slice of the targets and
// the all-to-alls around attention all matter from the first step. Runs are
// 8 steps: enough for the loss to fall, short enough for CI. Clipping is
// active (optim.grad_clip = 0.05), so the gradient norm feeds every update.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "equivalence.h"
#include "sequence_cases.h"

namespace kolos {
namespace {

// sp ranks of mode ulysses (x whatever else `overrides` sets).
RunConfig sequence(int sp, std::vector<std::string> overrides = {}) {
  return testing::sequence::mode("ulysses", sp, std::move(overrides));
}

TEST(Ulysses, MatchesSerial) {
  // sp 2 at 2 ranks, sp 4 at 4.
  REQUIRE_RANKS(2, 4);
  const RunConfig c = sequence(world_size(), {"parallel.data=1"});
  testing::expect_equivalent(serial(), c);
}

TEST(Ulysses, WithDataParallelMatchesSerial) {
  // sp 2 x dp 2, each dp rank 2 micro-batches of 4.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), sequence(2, {"parallel.data=2"}));
}

TEST(Ulysses, WithZero3MatchesSerial) {
  // sp 2 x dp 2 under ZeRO-3: parameters sharded over the 4 ranks of dp x sp.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), sequence(2, {"parallel.data=2", "parallel.zero.stage=3"}));
}

TEST(Ulysses, WithZero1MatchesSerial) {
  REQUIRE_RANKS(2);
  testing::expect_equivalent(serial(), sequence(2, {"parallel.zero.stage=1"}));
}

TEST(Ulysses, WithZero2MatchesSerial) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), sequence(2, {"parallel.data=2", "parallel.zero.stage=2"}));
}

TEST(Ulysses, WithThePipelineMatchesSerial) {
  // sp 2 x 2 stages, 1F1B over 4 micro-batches; stages cut by measured
  // time, whose probe runs whole samples outside the sp group.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(
      serial(), sequence(2, {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\"",
                             "parallel.pipeline.balance=\"time\""}));
}

TEST(Ulysses, WithTp1dMatchesSerial) {
  // sp 2 x tp 2: 4 heads, 2 per tensor rank, 1 per rank inside attention.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(
      serial(), sequence(2, {"parallel.tensor.size=2", "parallel.tensor.mode=\"1d\""}));
}

TEST(Ulysses, WithSelectiveRecomputeMatchesSerial) {
  // The head-split attention core is what "selective" recomputes; "full"
  // re-runs whole blocks, all-to-alls included, in backward.
  REQUIRE_RANKS(2);
  testing::expect_equivalent(serial(), sequence(2, {"train.recompute=\"selective\""}));
  testing::expect_equivalent(serial(), sequence(2, {"train.recompute=\"full\""}));
}

TEST(UlyssesLlama, GroupedQueryAttentionMatchesSerial) {
  // 8 query heads, 2 key/value heads: repeated to 8 before the all-to-all,
  // so sp 2 and sp 4 (above the 2 key/value heads) both divide; RoPE angles
  // follow each rank's global positions.
  REQUIRE_RANKS(2, 4);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  testing::expect_equivalent(serial(llama(gqa)), sequence(world_size(), llama(gqa)));
}

TEST(UlyssesLlama, WithTp1dAndGqaMatchesSerial) {
  // sp 2 x tp 2: each tensor rank 4 query heads of 1 key/value head.
  REQUIRE_RANKS(4);
  std::vector<std::string> mix =
      llama({"model.heads=8", "model.kv_heads=2", "parallel.tensor.size=2"});
  testing::expect_equivalent(serial(llama({"model.heads=8", "model.kv_heads=2"})),
                             sequence(2, mix));
}

TEST(UlyssesLlama, WithThePipelineAndGqaMatchesSerial) {
  // sp 2 x 2 stages: the untied LM head and its loss on the last stage.
  REQUIRE_RANKS(4);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  std::vector<std::string> mix = llama(gqa);
  mix.insert(mix.end(), {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""});
  testing::expect_equivalent(serial(llama(gqa)), sequence(2, mix));
}

TEST(Ulysses, SequenceTimesDataEqualsDataOnlyOfTheSameBatch) {
  // The loss of a sp 2 x dp 2 run is the mean over the whole global batch,
  // as the dp 4 run's is: not scaled by sp (each rank's loss is the mean of
  // its tokens, and gradients average over dp x sp).
  REQUIRE_RANKS(4);
  const RunConfig dp_only = testing::tiny_gpt_config(base({"parallel.data=4"}));
  const RunConfig mixed = sequence(2, {"parallel.data=2"});
  ASSERT_EQ(dp_only.train.global_batch, mixed.train.global_batch);
  const auto group = testing::world_group();
  const testing::RunRecord a = testing::run_and_record(dp_only, group);
  const testing::RunRecord b = testing::run_and_record(mixed, group);
  testing::expect_records_match(a, b, testing::Tolerance{}, "sp2 x dp2 vs dp4");
}

}  // namespace
}  // namespace kolos
