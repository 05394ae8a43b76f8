// Bad input around ZeRO: clear errors for what cannot work, a warning for
// what works but saves nothing.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "equivalence.h"
#include "kolos/core/error.h"
#include "kolos/core/mesh.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

using testing::config_error;

TEST(ZeroBadInput, StageOutsideZeroToThree) {
  for (const char* stage : {"4", "-1"}) {
    const std::string message = config_error({std::string("parallel.zero.stage=") + stage});
    EXPECT_NE(message.find("parallel.zero.stage"), std::string::npos) << message;
    EXPECT_NE(message.find("is not a ZeRO stage; valid: 0 (off), 1"), std::string::npos)
        << message;
  }
}

TEST(ZeroBadInput, ReshardAfterForwardIsAStage3Option) {
  std::string message =
      config_error({"parallel.zero.stage=2", "parallel.zero.reshard_after_forward=false"});
  // zero3's key: the plugin that runs refuses it and names the keys it takes.
  EXPECT_NE(message.find("unknown key `parallel.zero.reshard_after_forward`"), std::string::npos)
      << message;
  EXPECT_NE(message.find("(gradients plugin `zero2`): stage."), std::string::npos) << message;
  message = config_error({"parallel.zero.reshard_after_forward=false"});
  EXPECT_NE(message.find("(gradients plugin `dp`): stage."), std::string::npos) << message;
  message = config_error({"parallel.zero.stage=3", "parallel.zero.reshard_after_forward=2"});
  EXPECT_NE(message.find("expected true or false, found an integer"), std::string::npos)
      << message;
  EXPECT_EQ(config_error({"parallel.zero.stage=3", "parallel.zero.reshard_after_forward=false"}),
            "");
  EXPECT_EQ(config_error({"plugins.gradients=zero3", "parallel.zero.reshard_after_forward=false"}),
            "");
}

TEST(ZeroBadInput, StageAndGradientsPluginMustAgree) {
  const std::string message = config_error({"parallel.zero.stage=2", "plugins.gradients=dp"});
  EXPECT_NE(message.find("selects the gradients plugin `zero2`, but plugins.gradients names `dp`"),
            std::string::npos)
      << message;
  EXPECT_EQ(config_error({"parallel.zero.stage=2", "plugins.gradients=zero2"}), "");
}

TEST(ZeroBadInput, DataSizeOneWarnsAndTrains) {
  modules::register_builtin_models();
  for (int stage = 1; stage <= 3; ++stage) {
    RunConfig config = testing::tiny_gpt_config(
        {"parallel.data=1", "parallel.zero.stage=" + std::to_string(stage), "train.steps=5"});
    ::testing::internal::CaptureStderr();
    std::unique_ptr<Engine> engine;
    try {
      engine = std::make_unique<Engine>(config, testing::self_group(),
                                        [](const RunConfig& c) { return data::make_source(c); });
    } catch (...) {
      ::testing::internal::GetCapturedStderr();
      throw;
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("warning: zero" + std::to_string(stage) +
                       " with a data-parallel group of one rank"),
              std::string::npos)
        << err;
    const TrainSummary summary = engine->train();
    EXPECT_EQ(summary.steps, 5);
    EXPECT_LT(summary.final_loss, summary.first_loss);
  }
}

TEST(ZeroBadInput, EveryStageAcceptsPipelineParallelism) {
  // Stages 2 and 3 compose with pipelining (tests/mpi/pipeline checks them
  // against the serial run); the strategy's set-up accepts a pipeline size.
  modules::register_builtin_models();
  RunConfig config = testing::tiny_gpt_config({"parallel.pipeline.size=2"});
  DeviceMesh mesh(testing::self_group(), MeshShape{});
  auto factory = make_serial_layer_factory();
  factory->setup(mesh, config);
  PluginRegistry registry;
  for (const std::string stage : {"1", "2", "3"}) {
    auto model = build_model(config.model, *factory);
    auto strategy = registry.create<GradientStrategy>("gradients", "zero" + stage);
    ::testing::internal::CaptureStderr();
    EXPECT_NO_THROW(strategy->setup(*model, mesh, config)) << "zero" << stage;
    ::testing::internal::GetCapturedStderr();
  }
}

}  // namespace
}  // namespace kolos
