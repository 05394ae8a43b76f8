// The pipeline plugin's settings ([parallel.pipeline] besides size, read by
// the plugin itself): read, and bad values reported with file:line:col, what
// was found and what would be valid; [log] trace as the core reads it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/core/roles.h"
#include "kolos/core/run_config.h"
#include "kolos/schedules/pipeline_settings.h"

namespace kolos {
namespace {

// The settings the pipeline plugin reads from `toml` (world: the mesh's size).
pipeline::PipelineSettings settings_of(const std::string& toml) {
  const RunConfig config = parse_run_config(toml, "run.toml");
  const MeshShape shape = resolve_mesh_shape(config, config.parallel.pipeline.size);
  const int64_t accumulation = config.train.global_batch / (config.train.micro_batch * shape.dp);
  const RoleSpec& spec = role_spec("pipeline");
  return pipeline::read_pipeline_settings(PluginContext{config, config.section(spec.section),
                                                        spec.core_keys, "pipeline plugin", shape,
                                                        accumulation});
}

std::string error_of(const std::string& toml) {
  try {
    settings_of(toml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineConfig, ReadsBalanceCutAndTrace) {
  const std::string text =
      "[parallel]\npipeline = { size = 2, schedule = \"gpipe\", layers_per_stage = [3, 1] }\n"
      "[log]\ntrace = true\ntrace_dir = \"traces\"\n";
  EXPECT_EQ(settings_of(text).layers_per_stage, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(settings_of(text).schedule, "gpipe");
  RunConfig c = parse_run_config(text, "run.toml");
  EXPECT_TRUE(c.log.trace);
  EXPECT_EQ(c.log.trace_dir, "traces");
  // Written back as given: the plugin reads the same from the effective config.
  EXPECT_EQ(settings_of(to_toml(c)).layers_per_stage, (std::vector<int64_t>{3, 1}));
  EXPECT_TRUE(parse_run_config(to_toml(c), "back.toml").log.trace);

  const std::string timed = "[parallel]\npipeline = { size = 2, balance = \"time\" }\n";
  EXPECT_EQ(settings_of(timed).balance, "time");
  EXPECT_EQ(settings_of(to_toml(parse_run_config(timed, "r"))).balance, "time");
  EXPECT_EQ(settings_of("[parallel]\npipeline = 2\n").balance, "params");
  EXPECT_EQ(settings_of("[parallel]\npipeline = 2\n").schedule, "1f1b");
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
      {"[parallel]\npipeline = { size = 2, schedule = \"gpipe\", microbatches = 3 }\n",
       {"run.toml:2", "parallel.pipeline.microbatches: 3", "gives 2 micro-batches",
        "set microbatches = 2"}},
      {"[parallel]\npipeline = { size = 2, schedulr = \"zb\" }\n",
       {"run.toml:2", "unknown key `parallel.pipeline.schedulr`", "pipeline plugin",
        "Did you mean `schedule`?"}},
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
