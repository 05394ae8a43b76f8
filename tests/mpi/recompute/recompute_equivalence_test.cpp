// Activation recomputation (train.recompute) against the same run without
// it: every step's loss and gradient norm and every final parameter must be
// bit-equal in fp32, serially and with zero3, the pipeline (1f1b and zb)
// and tensor parallelism (every mode), since recomputation re-runs the same
// kernels on the same values and hands autograd the same gradients; and
// the re-runs backward made are counted, so a recomputation that silently
// kept the activations fails.
// Bad input: an unknown mode and recompute_every < 1 are ConfigErrors.
//
// 1 rank: serial and bad input; 2 ranks: zero3, pipeline, tp1d; 4 ranks:
// zero3, tp2d, tp1d with dp, pipeline with dp and with zero3; 8 ranks:
// tp2p5d, tp3d.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/recompute.h"

namespace kolos {
namespace {

using testing::world_size;

// A 3-block GPT (recompute_every = 2 then leaves one block plain), two
// micro-batches (of 2 unless said) per rank and step, 8 steps.
RunConfig config(std::vector<std::string> overrides, const std::string& mode, int every, int dp,
                 int micro) {
  overrides.push_back("model.layers=3");
  overrides.push_back("train.steps=8");
  overrides.push_back("train.micro_batch=" + std::to_string(micro));
  overrides.push_back("train.global_batch=" + std::to_string(2 * micro * dp));
  overrides.push_back("train.recompute=\"" + mode + "\"");
  overrides.push_back("train.recompute_every=" + std::to_string(every));
  return testing::tiny_gpt_config(overrides);
}

// The mix `overrides` with recompute = none, full, selective and full every
// 2nd block, on the world (or, serial, on this rank alone). Bit-equal
// results alone would also pass a recomputation that never ran, so each
// run also counts the re-runs backward made (recomputations_run(), summed
// over the ranks): none for "none", some for every other mode, and fewer
// for every 2nd block than for every block.
void expect_modes_bit_equal(const std::vector<std::string>& overrides, int dp, bool serial,
                            int micro = 2) {
  auto group = serial ? testing::self_group() : testing::world_group();
  int64_t reruns = 0;
  auto run = [&](const std::string& mode, int every) {
    const int64_t before = recomputations_run();
    auto record = testing::run_and_record(config(overrides, mode, every, dp, micro), group);
    reruns = recomputations_run() - before;
    if (!serial) MPI_Allreduce(MPI_IN_PLACE, &reruns, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return record;
  };
  const auto reference = run("none", 1);
  ASSERT_EQ(reference.losses.size(), 8u);
  EXPECT_EQ(reruns, 0) << "recompute = none re-ran something";
  testing::expect_records_bit_equal(reference, run("full", 1), "full");
  const int64_t full_reruns = reruns;
  EXPECT_GT(full_reruns, 0) << "recompute = full: backward re-ran nothing";
  testing::expect_records_bit_equal(reference, run("selective", 1), "selective");
  EXPECT_GT(reruns, 0) << "recompute = selective: backward re-ran no attention core";
  testing::expect_records_bit_equal(reference, run("full", 2), "full, every 2nd block");
  EXPECT_GT(reruns, 0) << "recompute = full every 2nd block: backward re-ran nothing";
  EXPECT_LT(reruns, full_reruns) << "every 2nd block re-ran as many blocks as every block";
}

TEST(Recompute, SerialBitEqual) {
  if (world_size() != 1) GTEST_SKIP() << "serial: 1 rank";
  expect_modes_bit_equal({"parallel.data=1"}, 1, /*serial=*/true);
}

TEST(Recompute, Zero3BitEqual) {
  if (world_size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  expect_modes_bit_equal({"parallel.zero.stage=3"}, world_size(), false);
}

TEST(Recompute, Zero3KeepingParametersBitEqual) {
  if (world_size() != 2) GTEST_SKIP() << "2 ranks";
  expect_modes_bit_equal({"parallel.zero.stage=3", "parallel.zero.reshard_after_forward=false"},
                         2, false);
}

TEST(Recompute, Pipeline1f1bBitEqual) {
  if (world_size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  // 2 stages, by data parallelism over the rest (4 ranks: dp 2).
  const int dp = world_size() / 2;
  expect_modes_bit_equal({"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""}, dp,
                         false);
}

TEST(Recompute, PipelineZeroBubbleBitEqual) {
  // zb splits each backward: the input's gradient first (graph kept), the
  // weights' later; a recomputed block is recomputed by each half.
  if (world_size() != 2) GTEST_SKIP() << "2 ranks";
  expect_modes_bit_equal({"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"zb\""}, 1,
                         false);
}

TEST(Recompute, Pipeline1f1bWithZero3BitEqual) {
  if (world_size() != 4) GTEST_SKIP() << "4 ranks";
  expect_modes_bit_equal({"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\"",
                          "parallel.zero.stage=3"},
                         2, false);
}

TEST(Recompute, Tp1dBitEqual) {
  if (world_size() != 2) GTEST_SKIP() << "2 ranks";
  expect_modes_bit_equal({"parallel.tensor.size=2", "parallel.tensor.mode=\"1d\""}, 1, false);
}

TEST(Recompute, Tp1dWithDpBitEqual) {
  // tp collectives re-run in backward while dp's bucket reductions launch
  // from the gradient hooks: same order on every rank, no deadlock.
  if (world_size() != 4) GTEST_SKIP() << "4 ranks";
  expect_modes_bit_equal({"parallel.tensor.size=2", "parallel.tensor.mode=\"1d\""}, 2, false);
}

TEST(Recompute, Tp2dBitEqual) {
  if (world_size() != 4) GTEST_SKIP() << "4 ranks";
  expect_modes_bit_equal({"parallel.tensor.size=4", "parallel.tensor.mode=\"2d\""}, 1, false);
}

TEST(Recompute, Tp2p5dBitEqual) {
  if (world_size() != 8) GTEST_SKIP() << "8 ranks";
  expect_modes_bit_equal({"parallel.tensor.size=8", "parallel.tensor.mode=\"2.5d\"",
                          "parallel.tensor.depth=2"},
                         1, false, /*micro=*/4);
}

TEST(Recompute, Tp3dBitEqual) {
  if (world_size() != 8) GTEST_SKIP() << "8 ranks";
  expect_modes_bit_equal({"parallel.tensor.size=8", "parallel.tensor.mode=\"3d\""}, 1, false,
                         /*micro=*/4);
}

TEST(RecomputeBadInput, UnknownModeAndEveryBelowOne) {
  if (world_size() != 1) GTEST_SKIP() << "1 rank";
  std::string message = testing::config_error({"train.recompute=\"ful\""});
  EXPECT_NE(message.find("train.recompute"), std::string::npos) << message;
  EXPECT_NE(message.find("\"none\", \"full\", \"selective\""), std::string::npos) << message;
  EXPECT_NE(message.find("Did you mean \"full\"?"), std::string::npos) << message;
  message = testing::config_error({"train.recompute=true"});
  EXPECT_NE(message.find("train.recompute"), std::string::npos) << message;
  for (const char* every : {"0", "-2"}) {
    message = testing::config_error({std::string("train.recompute_every=") + every});
    EXPECT_NE(message.find("train.recompute_every"), std::string::npos) << message;
    EXPECT_NE(message.find(">= 1"), std::string::npos) << message;
  }
  EXPECT_EQ(testing::config_error({"train.recompute=\"selective\"", "train.recompute_every=3"}), "");
}

}  // namespace
}  // namespace kolos
