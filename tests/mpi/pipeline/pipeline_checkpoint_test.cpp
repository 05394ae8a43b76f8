// Checkpoints across pipeline layouts: a checkpoint saved under pipeline x dp
// (2 x world/2, 1F1B, and with zero1) loads under the serial layout, and a
// serial checkpoint loads under pipeline x dp. Loaded parameters equal the
// saved ones bit for bit; training continues as the uninterrupted serial run
// does (losses within 1e-5 relative). Each stage writes its own blocks; the
// tied token embedding is written once (by stage 0).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kSaveAt = 4, kSteps = 8;

using testing::world_rank;
using testing::world_size;

std::string shared_tmpdir() { return testing::shared_tmpdir("pp-ckpt"); }

RunConfig config_of(std::vector<std::string> overrides) {
  overrides.push_back("train.steps=" + std::to_string(kSteps));
  return testing::tiny_gpt_config(overrides);
}
RunConfig serial() { return config_of({"parallel.data=1"}); }
RunConfig pipelined(int zero_stage) {
  return config_of({"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\"",
                    "parallel.zero.stage=" + std::to_string(zero_stage)});
}

std::unique_ptr<Engine> make_engine(const RunConfig& config, const comm::ProcessGroupPtr& group) {
  modules::register_builtin_models();
  return std::make_unique<Engine>(config, group,
                                  [](const RunConfig& c) { return data::make_source(c); });
}

// A checkpoint into an engine, as `kolos train --resume` does it.
void load_into(Engine& engine, const comm::ProcessGroupPtr& group, const std::string& root) {
  checkpoint::Checkpointer ckpt(group, {root, 0, false});
  TrainingState state = engine.state();
  ckpt.load(root, state);
  engine.load_state(state);
}

void expect_same_parameters(const std::vector<std::pair<std::string, at::Tensor>>& a,
                            const std::vector<std::pair<std::string, at::Tensor>>& b,
                            const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << what;
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << what << ": " << a[i].first;
  }
}

void expect_losses_close(const std::vector<double>& resumed, const std::vector<double>& straight,
                         const std::string& what) {
  ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps - kSaveAt)) << what;
  for (size_t i = 0; i < resumed.size(); ++i) {
    const double ref = straight[kSaveAt + i];
    EXPECT_NEAR(resumed[i], ref, 1e-5 * std::abs(ref)) << what << ": step " << kSaveAt + i + 1;
  }
}

class PipelineCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(PipelineCheckpoint, SavedUnderPipelineLoadsUnderSerial) {
  const std::string root = shared_tmpdir();
  auto engine = make_engine(pipelined(GetParam()), testing::world_group());
  for (int64_t s = 0; s < kSaveAt; ++s) engine->step();
  {
    checkpoint::Checkpointer ckpt(testing::world_group(), {root, 0, false});
    ckpt.save(engine->state());
  }
  const auto saved = engine->gathered_parameters();
  engine.reset();
  const std::string dir = root + "/" + checkpoint::step_dir_name(kSaveAt);
  if (world_rank() == 0) {
    EXPECT_TRUE(checkpoint::verify(dir).empty());
    // The tied embedding is written by stage 0 only, once (ZeRO-1 keeps
    // parameters whole at rest; verify() above checked the cover).
    const int64_t expected = 1;
    int found = 0;
    for (const auto& t : checkpoint::inspect(dir).tensors) {
      if (t.path.find("model/embed.wte.weight") == std::string::npos) continue;
      EXPECT_EQ(t.pieces, expected) << t.path;
      ++found;
    }
    EXPECT_EQ(found, 1);
  }
  // Every rank loads it on its own, serially.
  auto loaded = make_engine(serial(), testing::self_group());
  load_into(*loaded, testing::self_group(), root);
  EXPECT_EQ(loaded->steps_done(), kSaveAt);
  expect_same_parameters(saved, loaded->gathered_parameters(), "pipeline -> serial");
  const auto resumed = loaded->train().losses;
  const auto straight = make_engine(serial(), testing::self_group())->train().losses;
  expect_losses_close(resumed, straight, "pipeline -> serial");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(root);
}

TEST_P(PipelineCheckpoint, SavedUnderSerialLoadsUnderPipeline) {
  const std::string root = shared_tmpdir();
  std::vector<double> straight;
  {
    auto reference = make_engine(serial(), testing::self_group());
    for (int64_t s = 0; s < kSaveAt; ++s) reference->step();
    if (world_rank() == 0) {
      checkpoint::Checkpointer ckpt(testing::self_group(), {root, 0, false});
      ckpt.save(reference->state());
    }
    straight = make_engine(serial(), testing::self_group())->train().losses;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto serial_state = make_engine(serial(), testing::self_group());
  load_into(*serial_state, testing::self_group(), root);
  auto engine = make_engine(pipelined(GetParam()), testing::world_group());
  load_into(*engine, testing::world_group(), root);
  EXPECT_EQ(engine->steps_done(), kSaveAt);
  EXPECT_EQ(engine->state().optimizer_steps, kSaveAt);
  expect_same_parameters(serial_state->gathered_parameters(), engine->gathered_parameters(),
                         "serial -> pipeline");
  expect_losses_close(engine->train().losses, straight, "serial -> pipeline");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Pipeline, PipelineCheckpoint, ::testing::Values(0, 1),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

}  // namespace
}  // namespace kolos
