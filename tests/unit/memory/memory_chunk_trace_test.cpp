// The chunks plugin's trace (plugins/memory/chunk_trace.h): the steps of
// one iteration and the chunks each needs, on a hand-made model of three
// parameters in two chunks read by two blocks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chunk_trace.h"
#include "kolos/core/error.h"

namespace kolos::chunks {
namespace {

using memory::ChunkId;
using Ids = std::vector<ChunkId>;

// p0 and p1 in chunk 0, p2 in chunk 1; block 0 reads p0 and p1, block 1
// reads p2; one micro-batch (forward 0, 1, backward 1, 0); chunks of 100
// bytes in every kind; this rank owns and keeps every chunk, reduced over
// several ranks, nothing gathered.
TraceInputs two_blocks() {
  TraceInputs in;
  in.chunks = 2;
  in.kinds = kExpAvgSq + 1;  // fp32: no masters
  in.names = {"p0", "p1", "p2"};
  in.chunk_of = {0, 0, 1};
  in.uses = {{0, 1}, {2}};
  in.passes = {{false, 0, 2, false}, {true, 0, 2, false}};
  in.kind_bytes = [](size_t) { return int64_t{100}; };
  in.owns = [](size_t) { return true; };
  in.keeps_params = [](size_t) { return true; };
  in.gathered = [](size_t) { return false; };
  in.reduced = [](size_t) { return true; };
  return in;
}

TEST(ChunkTrace, BlocksForwardThenBackwardThenOneOptimizerStepPerChunk) {
  const ChunkTrace t(two_blocks());
  // Executor chunks: parameters 0, 1; gradients 2, 3; exp_avg 4, 5; exp_avg_sq 6, 7.
  ASSERT_EQ(t.access.chunks.size(), 8u);
  EXPECT_EQ(t.id(kGrad, 1), 3u);
  EXPECT_FALSE(t.has(kMaster, 0));
  ASSERT_EQ(t.steps.size(), 6u);
  EXPECT_EQ(t.steps[2].type, TraceStep::kBackward);
  EXPECT_EQ(t.steps[2].index, 1u);
  EXPECT_EQ(t.optimizer_begin, 4u);
  EXPECT_EQ(t.tied_step, ChunkTrace::kNoStep);
  const std::vector<Ids> expected = {{0}, {1}, {1, 3}, {0, 2}, {0, 2, 4, 6}, {1, 3, 5, 7}};
  EXPECT_EQ(t.access.steps, expected);
  // Gradient chunks are zeroed where first used; a gradient is final (its
  // norm taken) after the last backward step that reads its parameter.
  EXPECT_EQ(t.zero_at, (std::vector<Ids>{{}, {}, {3}, {2}, {}, {}}));
  EXPECT_EQ(t.norm_at, (std::vector<std::vector<size_t>>{{}, {}, {2}, {0, 1}, {}, {}}));
  EXPECT_TRUE(t.unused.empty());
}

TEST(ChunkTrace, AParameterNoBlockReadsIsUnusedAndItsNormTakenEverywhere) {
  TraceInputs in = two_blocks();
  in.uses = {{0}, {2}};  // nothing reads p1
  const ChunkTrace t(std::move(in));
  EXPECT_EQ(t.unused, (std::vector<size_t>{1}));
  EXPECT_EQ(t.norm_everywhere, (std::vector<bool>{false, true, false}));
}

// ZeRO-3 over two ranks, this one owning chunk index 0: no optimizer
// chunks of index 1 here, nor its parameter chunk in its optimizer step;
// each parameter chunk is gathered where a block step needs it and the
// step before did not.
TEST(ChunkTrace, UnderZero3TheOwnersStatesAndTheGathers) {
  TraceInputs in = two_blocks();
  in.owns = [](size_t k) { return k == 0; };
  in.keeps_params = [](size_t k) { return k == 0; };
  in.gathered = [](size_t) { return true; };
  const ChunkTrace t(std::move(in));
  // Parameters 0, 1; gradients 2, 3; exp_avg 4; exp_avg_sq 5.
  ASSERT_EQ(t.access.chunks.size(), 6u);
  EXPECT_FALSE(t.has(kExpAvg, 1));
  EXPECT_EQ(t.access.steps[4], (Ids{0, 2, 4, 5}));
  EXPECT_TRUE(t.access.steps[5].empty());
  EXPECT_EQ(t.gather_at, (std::vector<Ids>{{0}, {1}, {}, {0}, {}, {}}));
}

// A reduction overlaps the next block step where the budget holds both
// steps' chunks; gathers ahead likewise.
TEST(ChunkTrace, OverlapsOnlyWhereTheBudgetHasRoom) {
  ChunkTrace t(two_blocks());
  t.augment(true, false, 1000);
  EXPECT_EQ(t.overlap, (std::vector<bool>{false, false, true, false, false, false}));
  EXPECT_EQ(t.access.steps[3], (Ids{0, 2, 3}));  // gradient chunk 3 stays while it is reduced
  t.augment(true, false, 200);                    // step 3 alone needs 200 bytes
  EXPECT_EQ(t.overlap, (std::vector<bool>{false, false, false, false, false, false}));
  EXPECT_EQ(t.access.steps[3], (Ids{0, 2}));
  TraceInputs in = two_blocks();
  in.gathered = [](size_t) { return true; };
  ChunkTrace z(std::move(in));
  z.augment(false, true, 1000);
  // Step 1 gathers chunk 1 during step 0; step 3 gathers chunk 0 during step 2.
  EXPECT_EQ(z.ahead, (std::vector<bool>{false, true, false, true, false, false}));
  EXPECT_EQ(z.access.steps[0], (Ids{0, 1}));
}

TEST(ChunkTrace, ATiedWeightNoBlockReadsIsRefusedByName) {
  TraceInputs in = two_blocks();
  in.uses = {{0}, {2}};
  in.tied = {1};
  try {
    ChunkTrace t(std::move(in));
    FAIL() << "expected kolos::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tied weight p1 is read by no block"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kolos::chunks
