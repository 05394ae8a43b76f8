// Bytes sent per step by tensor parallelism equal the analytic volume of
// each mode (tests/support/tp_volume.h, computed from the model's shape),
// on every rank. The bytes are observed at the MPI boundary by
// libkolos_pmpi_count (tests/support/observed_traffic.h says what "sent"
// means per call) on the communicators of the tp group and the grid's
// sub-groups; the engine's own world reductions (loss, timing) are not tp
// traffic.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/engine.h"
#include "kolos/core/mesh.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"
#include "observed_traffic.h"
#include "tp_volume.h"

namespace kolos {
namespace {

using testing::world_size;

testing::ObservedTraffic tp_traffic(const DeviceMesh& mesh) {
  std::vector<comm::ProcessGroupPtr> groups = mesh.extra_groups();
  groups.push_back(mesh.group(Axis::kTP));
  return testing::observed_traffic(groups);
}

struct Case {
  std::string mode;
  int size, depth;
};

void PrintTo(const Case& m, std::ostream* os) { *os << m.mode << " at " << m.size; }

class TpVolume : public ::testing::TestWithParam<Case> {};

TEST_P(TpVolume, BytesPerStepEqualTheAnalyticVolume) {
  const Case c = GetParam();
  if (world_size() != c.size) GTEST_SKIP() << "runs at " << c.size << " ranks";
  ASSERT_EQ(testing::pmpi_interposition_problem(), "");
  // 2 micro-batches of 4 per step; every dimension divides evenly.
  std::vector<std::string> overrides = {"parallel.tensor.size=" + std::to_string(c.size),
                                        "parallel.tensor.mode=" + c.mode, "train.global_batch=8",
                                        "train.micro_batch=4", "train.steps=2"};
  if (c.mode == "2.5d") overrides.push_back("parallel.tensor.depth=" + std::to_string(c.depth));
  RunConfig config = testing::tiny_gpt_config(overrides);
  modules::register_builtin_models();
  Engine engine(config, testing::world_group(),
                [](const RunConfig& r) { return data::make_source(r); });
  const testing::TpShape shape = testing::tp_shape(config, engine.accumulation());
  const uint64_t expected = static_cast<uint64_t>(testing::tp_bytes_per_step(shape));
  for (int step = 0; step < 2; ++step) {
    testing::reset_observed_traffic();
    engine.step();
    const testing::ObservedTraffic seen = tp_traffic(engine.mesh());
    EXPECT_GE(seen.communicators, 1);
    EXPECT_EQ(seen.sent(), expected) << "mode " << c.mode << " at " << c.size << " ranks, step "
                                     << step << ", rank " << engine.mesh().rank();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, TpVolume,
                         ::testing::Values(Case{"1d", 2, 1}, Case{"1d", 4, 1}, Case{"2d", 4, 1},
                                           Case{"2.5d", 8, 2}, Case{"3d", 8, 1}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string mode = info.param.mode == "2.5d" ? "2p5d" : info.param.mode;
                           return mode + "_" + std::to_string(info.param.size);
                         });

}  // namespace
}  // namespace kolos
