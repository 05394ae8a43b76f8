// Plugins own their settings: each role's plugin reads and checks its keys
// in configure() (through plan_run, as every rank does before it
// communicates), with the same shape of message as the core's keys:
// file:line:col, the key, what was found, what would be valid, and the
// plugin's valid keys for an unknown one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/run_config.h"

namespace kolos {
namespace {

constexpr const char* kName = "run.toml";

// The ConfigError plan_run raises for `text` at `world` ranks ("" if none).
std::string plan_error(const std::string& text, int64_t world) {
  try {
    plan_run(parse_run_config(text, kName), world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

::testing::AssertionResult has_all(const std::string& message,
                                   const std::vector<std::string>& parts) {
  if (message.empty()) return ::testing::AssertionFailure() << "no error";
  for (const auto& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "missing `" << part << "` in:\n" << message;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(PluginSettings, UnknownKeysNameThePluginAndItsKeys) {
  EXPECT_TRUE(has_all(plan_error("[parallel]\ntensor = { size = 4, mdoe = \"2d\" }\n", 4),
                      {"run.toml:2:22: ", "unknown key `parallel.tensor.mdoe`",
                       "valid keys in [parallel.tensor] (layers plugin `tp1d`): size, mode",
                       "Did you mean `mode`?"}));
  EXPECT_TRUE(
      has_all(plan_error("[parallel]\ntensor = { size = 8, mode = \"2.5d\", dept = 2 }\n", 8),
              {"(layers plugin `tp2p5d`): size, mode, depth", "Did you mean `depth`?"}));
  EXPECT_TRUE(has_all(plan_error("[parallel]\npipeline = { size = 2, chunk = 2 }\n", 2),
                      {"run.toml:2:", "unknown key `parallel.pipeline.chunk`",
                       "(pipeline plugin `pipeline`): size, schedule, microbatches, chunks, "
                       "balance, layers_per_stage",
                       "Did you mean `chunks`?"}));
  EXPECT_TRUE(
      has_all(plan_error("[parallel.zero]\nstage = 3\nreshard_after_froward = true\n", 2),
              {"run.toml:3:1", "(gradients plugin `zero3`): stage, reshard_after_forward"}));
}

TEST(PluginSettings, AKeyOfAnotherPluginIsRefusedByTheOneThatRuns) {
  EXPECT_TRUE(
      has_all(plan_error("[parallel]\ntensor = { size = 4, mode = \"2d\", depth = 2 }\n", 4),
              {"run.toml:2:35", "unknown key `parallel.tensor.depth`",
               "(layers plugin `tp2d`): size, mode"}));
  EXPECT_TRUE(has_all(
      plan_error("[parallel]\nzero = { stage = 2, reshard_after_forward = false }\n", 2),
      {"unknown key `parallel.zero.reshard_after_forward`", "(gradients plugin `zero2`): stage"}));
  EXPECT_TRUE(has_all(plan_error("[parallel]\nzero = { reshard_after_forward = false }\n", 2),
                      {"(gradients plugin `dp`): stage"}));
  EXPECT_TRUE(has_all(plan_error("[parallel]\npipeline = { size = 1, schedule = \"zb\" }\n", 1),
                      {"unknown key `parallel.pipeline.schedule`",
                       "(the built-in pipeline `single-stage`): size"}));
  EXPECT_EQ(plan_error("[parallel]\nzero = { stage = 3, reshard_after_forward = false }\n", 2), "");
  EXPECT_EQ(plan_error("[parallel]\ntensor = { size = 8, mode = \"2.5d\", depth = 2 }\n"
                       "[train]\nmicro_batch = 4\nglobal_batch = 8\n",
                       8),
            "");
}

TEST(PluginSettings, ValuesAreCheckedByTheirPlugin) {
  EXPECT_TRUE(has_all(plan_error("[parallel]\npipeline = { size = 2, schedule = \"1f1f\" }\n", 2),
                      {"run.toml:2:", "parallel.pipeline.schedule",
                       "\"gpipe\", \"1f1b\", \"interleaved\", \"zb\"", "Did you mean \"1f1b\"?"}));
  EXPECT_TRUE(has_all(plan_error("[parallel]\npipeline = { size = 2, chunks = 0 }\n", 2),
                      {"parallel.pipeline.chunks", ">= 1"}));
  EXPECT_TRUE(
      has_all(plan_error("[parallel]\ntensor = { size = 8, mode = \"2.5d\", depth = 0 }\n", 8),
              {"run.toml:2:", "parallel.tensor.depth: 0 is out of range"}));
  EXPECT_TRUE(
      has_all(plan_error("[parallel]\nzero = { stage = 3, reshard_after_forward = 1 }\n", 2),
              {"parallel.zero.reshard_after_forward", "true or false"}));
}

TEST(PluginSettings, TensorModeShapeNamesNearestSizes) {
  EXPECT_TRUE(has_all(plan_error("[parallel]\ntensor = { size = 8, mode = \"2d\" }\n", 8),
                      {"run.toml:2:19", "parallel.tensor.size = 8", "mode \"2d\"", "q*q",
                       "nearest valid sizes: 4 or 9"}));
  EXPECT_TRUE(has_all(plan_error("[parallel]\ntensor = { size = 9, mode = \"3d\" }\n", 9),
                      {"parallel.tensor.size = 9", "q*q*q", "8 or 27"}));
  EXPECT_TRUE(has_all(plan_error("[parallel]\ntensor = { size = 2, mode = \"3d\" }\n", 2),
                      {"nearest valid sizes: 1 or 8"}));
  EXPECT_TRUE(
      has_all(plan_error("[parallel]\ntensor = { size = 8, mode = \"2.5d\", depth = 1 }\n", 8),
              {"q*q*depth with depth = 1", "4 or 9", "keep size 8 with depth = 2 or 8"}));
  EXPECT_TRUE(
      has_all(plan_error("[parallel]\ntensor = { size = 12, mode = \"2.5d\", depth = 2 }\n", 12),
              {"depth = 2", "8 or 18", "depth = 3 or 12"}));
  EXPECT_TRUE(
      has_all(plan_error("[parallel]\ntensor = { size = 4, mode = \"2.5d\", depth = 2 }\n", 4),
              {"depth = 2", "2 or 8", "depth = 1 or 4"}));
  // Valid grids (micro_batch 4 splits over every batch grid here).
  const std::string batch = "[train]\nmicro_batch = 4\nglobal_batch = 8\n";
  EXPECT_EQ(plan_error("[parallel]\ntensor = { size = 4, mode = \"2d\" }\n" + batch, 4), "");
  EXPECT_EQ(plan_error("[parallel]\ntensor = { size = 8, mode = \"3d\" }\n" + batch, 8), "");
}

TEST(PluginSettings, PipelineRulesThatNeedTheBatch) {
  EXPECT_TRUE(has_all(
      plan_error("[parallel]\npipeline = { size = 2, microbatches = 3 }\n", 2),
      {"parallel.pipeline.microbatches: 3", "gives 2 micro-batches", "set microbatches = 2"}));
  // 1F1B needs at least as many micro-batches as stages.
  EXPECT_TRUE(has_all(plan_error("[parallel]\npipeline = { size = 4 }\n[train]\nglobal_batch = 8\n"
                                 "micro_batch = 4\n",
                                 4),
                      {"M = train.global_batch 8 / (micro_batch 4 x data 1)"}));
}

}  // namespace
}  // namespace kolos
