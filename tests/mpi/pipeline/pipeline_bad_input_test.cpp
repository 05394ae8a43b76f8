// Bad input around pipelining: every rank raises the same clear error,
// naming the numbers and what would be valid, before any training.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/error.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// The message of the error that building an engine for `overrides` raises.
std::string engine_error(std::vector<std::string> overrides) {
  modules::register_builtin_models();
  try {
    RunConfig config = testing::tiny_gpt_config(overrides);
    Engine engine(config, testing::world_group(),
                  [](const RunConfig& c) { return data::make_source(c); });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_parts(const std::string& message, const std::vector<std::string>& parts) {
  ASSERT_FALSE(message.empty()) << "no error";
  for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
}

const std::string kPP = "parallel.pipeline.size=" + std::to_string(2);

TEST(PipelineBadInput, MoreStagesThanBlocks) {
  if (world_size() == 4) {
    // 1 transformer layer: 3 blocks (embed, h.0, head) for 4 stages.
    expect_parts(engine_error({"model.layers=1", "parallel.pipeline.size=4",
                               "parallel.pipeline.schedule=\"gpipe\""}),
                 {"parallel.pipeline.size = 4 is larger than the number of blocks",
                  "3 blocks (embed, h.0, head)", "use size <= 3"});
  }
  expect_parts(engine_error({"model.layers=1", kPP, "parallel.pipeline.schedule=\"interleaved\"",
                             "parallel.pipeline.chunks=2"}),
               {"size x chunks = 2 x 2 = 4 virtual stages", "3 blocks"});
}

TEST(PipelineBadInput, InterleavedNeedsBlocksDivisibleByStagesTimesChunks) {
  // 3 layers: 5 blocks into 2 x 2 virtual stages.
  expect_parts(engine_error({"model.layers=3", kPP, "parallel.pipeline.schedule=\"interleaved\"",
                             "parallel.pipeline.chunks=2"}),
               {"schedule \"interleaved\"", "5 blocks", "2 x 2 = 4", "multiple of 4", "8 blocks"});
}

TEST(PipelineBadInput, FewerMicroBatchesThanStages) {
  // global 4 / (micro 4 x data 1) = 1 micro-batch for 2 stages.
  const int dp = world_size() / 2;
  const std::string global = "train.global_batch=" + std::to_string(4 * dp);
  for (const char* schedule : {"1f1b", "zb", "interleaved"}) {
    expect_parts(
        engine_error({global, kPP, std::string("parallel.pipeline.schedule=\"") + schedule + "\""}),
        {"needs at least as many micro-batches as pipeline stages", "1 micro-batches for 2 stages",
         "schedule = \"gpipe\""});
  }
  EXPECT_EQ(engine_error({global, kPP, "parallel.pipeline.schedule=\"gpipe\""}), "");
  // Interleaved also needs M to be a multiple of P.
  const std::string three = "train.global_batch=" + std::to_string(12 * dp);
  expect_parts(engine_error({three, kPP, "parallel.pipeline.schedule=\"interleaved\"",
                             "parallel.pipeline.chunks=2", "model.layers=2"}),
               {"M = 3 and P = 2", "use M = 2 or 4"});
}

TEST(PipelineBadInput, ExplicitCutMustCoverTheBlocks) {
  expect_parts(
      engine_error({kPP, "parallel.pipeline.layers_per_stage=[2, 1]"}),
      {"layers_per_stage = [2, 1] sums to 3", "4 blocks (embed, h.0, h.1, head)", "sum to 4"});
  EXPECT_EQ(engine_error({kPP, "parallel.pipeline.layers_per_stage=[3, 1]"}), "");
}

TEST(PipelineBadInput, MicroBatchesMustAgreeWithTheBatch) {
  const int dp = world_size() / 2;
  expect_parts(
      engine_error({kPP, "parallel.pipeline.microbatches=3"}),
      {"parallel.pipeline.microbatches: 3",
       "gives " + std::to_string(4 / dp) + " micro-batches per step", "(or 0 to derive it)"});
  EXPECT_EQ(engine_error({kPP, "parallel.pipeline.microbatches=" + std::to_string(4 / dp)}), "");
}

}  // namespace
}  // namespace kolos
