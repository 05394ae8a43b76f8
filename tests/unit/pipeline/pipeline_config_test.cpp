// [parallel.pipeline] balance / layers_per_stage and [log] trace: parsed,
// written back by to_toml, and bad values reported with file:line:col, what
// was found and what would be valid.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/core/run_config.h"

namespace kolos {
namespace {

std::string error_of(const std::string& toml) {
  try {
    parse_run_config(toml, "run.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineConfig, ReadsBalanceCutAndTrace) {
  RunConfig c = parse_run_config(
      "[parallel]\npipeline = { size = 2, schedule = \"gpipe\", layers_per_stage = [3, 1] }\n"
      "[log]\ntrace = true\ntrace_dir = \"traces\"\n",
      "run.toml");
  EXPECT_EQ(c.parallel.pipeline.layers_per_stage, (std::vector<int64_t>{3, 1}));
  EXPECT_TRUE(c.log.trace);
  EXPECT_EQ(c.log.trace_dir, "traces");
  RunConfig back = parse_run_config(to_toml(c), "back.toml");
  EXPECT_EQ(back.parallel.pipeline.layers_per_stage, (std::vector<int64_t>{3, 1}));
  EXPECT_TRUE(back.log.trace);

  RunConfig t = parse_run_config("[parallel]\npipeline = { size = 2, balance = \"time\" }\n", "r");
  EXPECT_EQ(t.parallel.pipeline.balance, "time");
  EXPECT_EQ(parse_run_config(to_toml(t), "b").parallel.pipeline.balance, "time");
  EXPECT_EQ(parse_run_config("", "r").parallel.pipeline.balance, "params");
}

TEST(PipelineConfig, BadValuesSayWhereWhatAndWhatIsValid) {
  struct Case {
    std::string toml;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"[parallel]\npipeline = { size = 2, balance = \"flops\" }\n",
       {"run.toml:2", "parallel.pipeline.balance", "\"flops\"", "\"params\", \"time\""}},
      {"[parallel]\npipeline = { size = 2, layers_per_stage = [3, 2, 1] }\n",
       {"run.toml:2", "layers_per_stage", "3 entries", "2 stages"}},
      {"[parallel]\npipeline = { size = 2, schedule = \"interleaved\", chunks = 2, "
       "layers_per_stage = [1, 1] }\n",
       {"2 entries", "4 virtual stages (size 2 x chunks 2)"}},
      {"[parallel]\npipeline = { size = 2, layers_per_stage = [3, 0] }\n",
       {"layers_per_stage", "integers >= 1", "found an element 0"}},
      {"[parallel]\npipeline = { size = 2, layers_per_stage = 3 }\n",
       {"layers_per_stage", "expected an array", "found an integer"}},
      {"[parallel]\npipeline = { size = 2, balance = \"time\", layers_per_stage = [1, 1] }\n",
       {"layers_per_stage", "both set"}},
      {"[parallel]\npipeline = { size = 2, schedule = \"1f1b\", chunks = 2 }\n",
       {"run.toml:2", "chunks = 2 only applies to schedule = \"interleaved\"", "\"1f1b\""}},
      {"[log]\ntrace = \"yes\"\n", {"run.toml:2", "log.trace", "true or false"}},
      {"[log]\ntraces = true\n", {"unknown key `log.traces`", "trace_dir"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.toml);
    const std::string error = error_of(c.toml);
    ASSERT_FALSE(error.empty());
    for (const auto& part : c.expect) EXPECT_NE(error.find(part), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace kolos
