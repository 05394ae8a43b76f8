// Data parallelism (the dp plugin) against the serial run of the same GPT.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "equivalence.h"
#include "kolos/core/mesh.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

using testing::world_size;

// On 1 rank the dp run is the serial run: the comparisons below would
// compare a run with itself, so they need 2 or more ranks. What 1 rank does
// check: accumulation against one larger micro-batch, and no traffic.
constexpr const char* kNeedsRanks = "1 rank: the same run as the serial one";

TEST(DataParallel, MatchesSerial) {
  if (world_size() == 1) GTEST_SKIP() << kNeedsRanks;
  testing::expect_equivalent(testing::tiny_gpt_config({"parallel.data=1"}),
                             testing::tiny_gpt_config());
}

TEST(DataParallel, SmallBucketsMatchSerial) {
  if (world_size() == 1) GTEST_SKIP() << kNeedsRanks;
  // Many buckets (1 KiB each): launch order and overlap are exercised.
  testing::expect_equivalent(testing::tiny_gpt_config({"parallel.data=1"}),
                             testing::tiny_gpt_config({"parallel.bucket_kb=1"}));
}

TEST(DataParallel, AccumulationMatchesOneLargerMicroBatch) {
  // Each rank: 2 micro-batches of 2, vs serial: 1 micro-batch of 4 x ranks.
  const int n = world_size();
  const std::string global = "train.global_batch=" + std::to_string(4 * n);
  testing::expect_equivalent(
      testing::tiny_gpt_config(
          {"parallel.data=1", global, "train.micro_batch=" + std::to_string(4 * n)}),
      testing::tiny_gpt_config({global, "train.micro_batch=2"}));
}

TEST(DataParallel, ReducesOncePerStepWithTheRingVolume) {
  modules::register_builtin_models();
  // 4 micro-batches per rank per step; gradients must be reduced once.
  const int n = world_size();
  RunConfig config =
      testing::tiny_gpt_config({"train.global_batch=" + std::to_string(8 * n),
                                "train.micro_batch=2", "parallel.bucket_kb=8", "train.steps=3"});
  Engine engine(config, testing::world_group(),
                [](const RunConfig& c) { return data::make_source(c); });
  ASSERT_EQ(engine.accumulation(), 4);
  const auto& group = engine.mesh().group(AxisSet{Axis::kDP, Axis::kSP});
  // The first step also agrees on the buckets' ready order (one broadcast);
  // count the steps after it, whose buckets are the rebuilt ones.
  engine.step();
  group->reset_stats();
  engine.step();
  const comm::CommStats stats = group->stats();

  int64_t grad_bytes = 0;
  for (const auto& p : engine.model().placed_parameters()) grad_bytes += p.tensor.numel() * 4;
  const auto all_reduce = static_cast<int>(comm::OpType::kAllReduce);
  if (n == 1) {
    EXPECT_EQ(stats.total_bytes(), 0u) << "a single rank must not communicate";
    return;
  }
  const uint64_t expected = static_cast<uint64_t>(2 * (n - 1) * grad_bytes / n);
  EXPECT_EQ(stats.bytes[all_reduce], expected);
  // Buckets of 8 KiB: more than one, and one all_reduce per bucket per step.
  EXPECT_GT(stats.calls[all_reduce], 1u);
  EXPECT_LE(stats.calls[all_reduce], static_cast<uint64_t>(grad_bytes / 8192 + 12));
  EXPECT_EQ(stats.total_bytes(), stats.bytes[all_reduce]) << "only gradient all_reduce expected";
  const uint64_t calls_one_step = stats.calls[all_reduce];
  engine.step();
  EXPECT_EQ(group->stats().calls[all_reduce], 2 * calls_one_step);
}

TEST(DataParallel, ParametersStayIdenticalAcrossRanks) {
  if (world_size() == 1) GTEST_SKIP() << "1 rank: nothing to differ from";
  modules::register_builtin_models();
  RunConfig config = testing::tiny_gpt_config({"train.steps=3"});
  Engine engine(config, testing::world_group(),
                [](const RunConfig& c) { return data::make_source(c); });
  engine.train();
  for (const auto& p : engine.model().placed_parameters()) {
    at::Tensor mine = p.tensor.detach().clone();
    at::Tensor max = mine.clone(), min = mine.clone();
    engine.mesh().world()->all_reduce(max, comm::ReduceOp::kMax)->wait();
    engine.mesh().world()->all_reduce(min, comm::ReduceOp::kMin)->wait();
    EXPECT_TRUE(torch::equal(max, min)) << p.name << " differs between ranks";
  }
}

}  // namespace
}  // namespace kolos
