// Gradient buckets overlap backward: on a GPT with many buckets, at least
// one bucket's reduction has completed (its Work says so, observed with
// Work::is_completed() when finish_backward() is called) before backward
// ends, for dp (all-reduce) and zero1/zero2 (the same bucket engine).
// ZeRO-3's parameter gathers run ahead of the block that needs them.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "equivalence.h"
#include "kolos/core/mesh.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

class BucketOverlap : public ::testing::TestWithParam<int> {};

TEST_P(BucketOverlap, SomeBucketCompletesBeforeFinishBackward) {
  modules::register_builtin_models();
  const int stage = GetParam();
  // 8 blocks of hidden 64 (~200 KiB each) in 16 KiB buckets: about a
  // hundred buckets, most of them full long before backward reaches the
  // embedding. One micro-batch per step, so that every reduction counted
  // belongs to the backward that finish_backward() ends.
  const int n = testing::world_size();
  RunConfig config = testing::tiny_gpt_config(
      {"model.layers=8", "model.hidden=64", "parallel.bucket_kb=16", "train.steps=8",
       "train.micro_batch=8", "train.global_batch=" + std::to_string(8 * n),
       "parallel.zero.stage=" + std::to_string(stage)});
  Engine engine(config, testing::world_group(),
                [](const RunConfig& c) { return data::make_source(c); });
  ASSERT_EQ(engine.accumulation(), 1);
  int64_t most_completed = 0, fewest_reductions = INT64_MAX;
  double least_overlap = 1.0;
  for (int64_t s = 0; s < config.train.steps; ++s) {
    const StepMetrics m = engine.step();
    if (s == 0) continue;  // the first step records the ready order
    most_completed = std::max(most_completed, m.reduction.completed_before_finish);
    fewest_reductions = std::min(fewest_reductions, m.reduction.reductions);
    least_overlap = std::min(least_overlap, m.reduction.overlap_fraction());
    // The wait is timed inside the step: a timer that kept running across
    // steps, or never stopped, exceeds the step that contains it.
    EXPECT_GT(m.step_time_s, 0.0);
    EXPECT_LE(m.reduction.wait_s, m.step_time_s);
  }
  if (engine.mesh().rank() == 0) {
    std::printf(
        "%s: >= %lld reductions per step, up to %lld completed before finish_backward, "
        "overlap fraction >= %.3f\n",
        engine.roles().gradients.c_str(), static_cast<long long>(fewest_reductions),
        static_cast<long long>(most_completed), least_overlap);
  }
  EXPECT_GE(fewest_reductions, 3);
  EXPECT_GE(most_completed, 1) << "no bucket's reduction finished while backward ran";
  // Only the buckets of the last parameters to become ready (the tied
  // embedding) wait for the end of backward.
  EXPECT_GT(least_overlap, 0.5);
}

// zero3 gathers a block's parameters while the block before it (forward)
// or after it (backward) computes: all but the first forward block's and
// the first backward block's gathers are launched ahead.
TEST(GatherAhead, Zero3GathersTheNextBlockWhileOneComputes) {
  modules::register_builtin_models();
  const int n = testing::world_size();
  RunConfig config = testing::tiny_gpt_config(
      {"model.layers=8", "model.hidden=64", "train.steps=2", "train.micro_batch=8",
       "train.global_batch=" + std::to_string(8 * n), "parallel.zero.stage=3"});
  Engine engine(config, testing::world_group(),
                [](const RunConfig& c) { return data::make_source(c); });
  ASSERT_EQ(engine.roles().gradients, "zero3");
  for (int64_t s = 0; s < config.train.steps; ++s) {
    const StepMetrics m = engine.step();
    EXPECT_GT(m.gather.bytes, 0);
    EXPECT_LT(m.gather.bytes_ahead, m.gather.bytes) << "block 0's forward gather cannot be ahead";
    EXPECT_GT(m.gather.ahead_fraction(), 0.5);
    EXPECT_LE(m.gather.wait_s, m.step_time_s);  // timed inside the step
  }
}

INSTANTIATE_TEST_SUITE_P(Plugins, BucketOverlap, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? std::string("dp")
                                                  : "zero" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace kolos
