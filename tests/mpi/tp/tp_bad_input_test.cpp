// Bad input for tensor parallelism: clear errors, on every rank, naming the
// numbers, the nearest values that would work and the tensor sizes that fit.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/mesh.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

using testing::config_error;

// The configuration error an Engine raises for `overrides` on MPI_COMM_WORLD.
std::string engine_error(const std::vector<std::string>& overrides) {
  modules::register_builtin_models();
  try {
    Engine engine(testing::tiny_gpt_config(overrides), testing::world_group(),
                  [](const RunConfig& c) { return data::make_source(c); });
  } catch (const Error& e) {  // agreed across ranks: every rank gets it
    EXPECT_EQ(e.kind(), ErrorKind::kConfig) << e.what();
    return e.what();
  }
  return "";
}

void expect_has(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in: " << message;
}

TEST(TpBadInput, SizeThatDoesNotFitTheModesGrid) {
  std::string m = config_error({"parallel.tensor.size=8", "parallel.tensor.mode=2d"});
  expect_has(m, "parallel.tensor.size = 8 does not fit mode \"2d\"");
  expect_has(m, "nearest valid sizes: 4 or 9");
  m = config_error({"parallel.tensor.size=4", "parallel.tensor.mode=3d"});
  expect_has(m, "nearest valid sizes: 1 or 8");
  m = config_error(
      {"parallel.tensor.size=6", "parallel.tensor.mode=2.5d", "parallel.tensor.depth=2"});
  expect_has(m, "does not fit mode \"2.5d\"");
  expect_has(m, "2 or 8");
}

TEST(TpBadInput, HeadsThatDoNotDivide) {
  if (testing::world_size() != 4) GTEST_SKIP() << "runs at 4 ranks";
  std::string m = engine_error(
      {"parallel.tensor.size=4", "parallel.tensor.mode=1d", "model.heads=6", "model.hidden=48"});
  expect_has(
      m, "model.heads = 6 does not divide into the 4 attention-head groups of tensor mode \"1d\"");
  expect_has(m, "use model.heads = 4 or 8");
  expect_has(m, "or a tensor size of 1, 2, 3, 6");
  m = engine_error(
      {"parallel.tensor.size=4", "parallel.tensor.mode=2d", "model.heads=3", "model.hidden=48"});
  expect_has(
      m, "model.heads = 3 does not divide into the 2 attention-head groups of tensor mode \"2d\"");
  expect_has(m, "or a tensor size of 1, 9");
}

TEST(TpBadInput, MicroBatchThatDoesNotSplitOverTheGrid) {
  if (testing::world_size() != 4) GTEST_SKIP() << "runs at 4 ranks";
  const std::string m = engine_error({"parallel.tensor.size=4", "parallel.tensor.mode=2d",
                                      "train.micro_batch=3", "train.global_batch=12"});
  expect_has(m,
             "train.micro_batch = 3 does not divide into the 2 batch blocks of tensor mode \"2d\"");
  expect_has(m, "use train.micro_batch = 2 or 4");
  expect_has(m, "or a tensor size of 1, 9");
}

// A replicated linear layer is whole on every rank of a grid (models move
// their activations out of and into the grid's layout around it), and
// to_whole() undoes to_local().
TEST(TpGrid, ReplicatedLinearIsWholeAndLayoutsRoundTrip) {
  if (testing::world_size() != 4) GTEST_SKIP() << "runs at 4 ranks";
  RunConfig config =
      testing::tiny_gpt_config({"parallel.tensor.size=4", "parallel.tensor.mode=2d"});
  DeviceMesh mesh(testing::world_group(), resolve_mesh_shape(config, 4));
  auto factory = plan_run(config, 4).layers;
  ASSERT_EQ(factory->name(), "tp2d");
  factory->setup(mesh, config);
  const LayerPtr layer = factory->linear(LinearSpec{32, 24, true, LinearRole::kReplicated});
  EXPECT_EQ(layer->named_parameters()["weight"].sizes().vec(), (std::vector<int64_t>{24, 32}));
  torch::manual_seed(3);  // the same whole activation on every rank
  const at::Tensor whole = torch::randn({4, 3, 32});
  const at::Tensor local = factory->to_local(whole);
  EXPECT_EQ(local.sizes().vec(), (std::vector<int64_t>{2, 3, 16}));
  EXPECT_TRUE(torch::equal(factory->to_whole(local), whole));
  EXPECT_EQ(factory->batch_multiple(), 2);
}

}  // namespace
}  // namespace kolos
