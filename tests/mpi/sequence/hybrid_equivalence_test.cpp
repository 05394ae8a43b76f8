// Sequence parallelism, mode "hybrid" (Ulysses inside groups of a adjacent
// sp ranks x ring attention across the r = sp/a groups), against the serial
// run of the same model, seed and data: per-step losses within 1e-5
// relative, every step's global gradient norm within 1e-4 relative and the
// final gathered parameters within 5e-5 absolute (testing::Tolerance).
//
// The tiny GPT has 4 heads and 16 positions. Under hybrid 2 x 2 ring group
// j holds zigzag chunks j and 3-j of 4 (positions 0-3 and 12-15 for j = 0),
// one chunk on each of its two Ulysses ranks; the all-to-all joins them
// again. The learned positions or rotary angles, the slice of the targets,
// the all-to-alls and the causal mask across the ring all matter from the
// first step. Runs are 8 steps with clipping active (optim.grad_clip =
// 0.05), as in sequence_equivalence_test.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "equivalence.h"
#include "sequence_cases.h"

namespace kolos {
namespace {

// sp = a x r ranks of mode hybrid, Ulysses degree a (x whatever else
// `overrides` sets).
RunConfig hybrid(int a, int r, std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.sequence.size=" + std::to_string(a * r));
  overrides.push_back("parallel.sequence.mode=\"hybrid\"");
  overrides.push_back("parallel.sequence.ulysses=" + std::to_string(a));
  return testing::tiny_gpt_config(base(std::move(overrides)));
}

TEST(Hybrid, TwoByTwoMatchesSerial) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), hybrid(2, 2, {"parallel.data=1"}));
}

TEST(Hybrid, LengthThatDividesBySpButNotTwiceSp) {
  // 12 positions under 2 x 2: 4 zigzag chunks of 3, each group's 6 cut in
  // 2 slices of 3 (ring alone over 4 ranks needs a multiple of 8).
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial({"model.seq_len=12"}), hybrid(2, 2, {"model.seq_len=12"}));
}

TEST(Hybrid, WithThePipelineMatchesSerial) {
  // hybrid 2 x 1 x 2 stages, 1F1B over 4 micro-batches, stages cut by
  // measured time (whose probe runs whole samples outside the sp group).
  REQUIRE_RANKS(4);
  testing::expect_equivalent(
      serial(), hybrid(2, 1,
                       {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\"",
                        "parallel.pipeline.balance=\"time\""}));
}

TEST(HybridLlama, WithThePipelineAndGqaMatchesSerial) {
  // hybrid 1 x 2 x 2 stages: each stage's ring pair, the untied LM head and
  // its loss on the last stage.
  REQUIRE_RANKS(4);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  std::vector<std::string> mix = llama(gqa);
  mix.insert(mix.end(), {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""});
  testing::expect_equivalent(serial(llama(gqa)), hybrid(1, 2, mix));
}

TEST(Hybrid, TwoByTwoWithThePipelineMatchesSerial) {
  // hybrid 2 x 2 x 2 stages (8 ranks): each stage's four sp ranks run both
  // the all-to-alls and the ring, 1F1B over 4 micro-batches.
  REQUIRE_RANKS(8);
  testing::expect_equivalent(
      serial(), hybrid(2, 2, {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""}));
}

TEST(Hybrid, WithRecomputeMatchesSerial) {
  // "selective" recomputes nothing inside attention (the ring kernel keeps
  // no T x T scores); "full" re-runs whole blocks in backward, the forward
  // all-to-alls and ring included.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), hybrid(2, 2, {"train.recompute=\"selective\""}));
  testing::expect_equivalent(serial(), hybrid(2, 2, {"train.recompute=\"full\""}));
}

TEST(HybridLlama, TwoByTwoWithGroupedQueryAttentionMatchesSerial) {
  // 8 query heads, 2 key/value heads, repeated to 8 before the all-to-all;
  // 4 heads per rank around the ring. RoPE angles follow each rank's slice.
  REQUIRE_RANKS(4);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  testing::expect_equivalent(serial(llama(gqa)), hybrid(2, 2, llama(gqa)));
}

TEST(Hybrid, UlyssesOnlyMatchesSerialAndUlysses) {
  // a = 2, r = 1: the ring of one rank is serial attention over the
  // head-split sequence, as ulysses computes it.
  REQUIRE_RANKS(2);
  testing::expect_equivalent(serial(), hybrid(2, 1));
  const auto group = testing::world_group();
  testing::expect_records_match(
      testing::run_and_record(testing::sequence::mode("ulysses", 2), group),
      testing::run_and_record(hybrid(2, 1), group), testing::Tolerance{},
      "hybrid 2 x 1 vs ulysses sp2");
}

TEST(Hybrid, RingOnlyMatchesSerialAndRing) {
  // a = 1, r = 2: all-to-alls over one rank, the ring with ring's placement.
  REQUIRE_RANKS(2);
  testing::expect_equivalent(serial(), hybrid(1, 2));
  const auto group = testing::world_group();
  testing::expect_records_match(testing::run_and_record(testing::sequence::mode("ring", 2), group),
                                testing::run_and_record(hybrid(1, 2), group), testing::Tolerance{},
                                "hybrid 1 x 2 vs ring sp2");
}

TEST(Hybrid, WithZero3MatchesSerial) {
  // hybrid 2 x 1 x dp 2 under ZeRO-3: parameters sharded over dp x sp.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), hybrid(2, 1, {"parallel.data=2", "parallel.zero.stage=3"}));
}

TEST(Hybrid, WithTp1dMatchesSerial) {
  // tp 2 x hybrid 2 x 1: each tensor rank's 2 heads, 1 per rank inside
  // attention; tp 2 x hybrid 1 x 2: each tensor rank's 2 heads around the
  // ring.
  REQUIRE_RANKS(4);
  const std::vector<std::string> tp = {"parallel.tensor.size=2", "parallel.tensor.mode=\"1d\""};
  testing::expect_equivalent(serial(), hybrid(2, 1, tp));
  testing::expect_equivalent(serial(), hybrid(1, 2, tp));
}

}  // namespace
}  // namespace kolos
