// Bytes the pipeline sends per step on the pp group, observed at the MPI
// boundary (libkolos_pmpi_count; observed_traffic.h), equal the analytic
// volume of the schedule:
//
//   A = micro_batch x seq_len x hidden x 4   one activation (fp32), and its
//                                            gradient has the same size
//   T = vocab x hidden x 4                   the tied embedding's gradient
//
// A rank sends, per step of M micro-batches, A x M for every virtual stage
// it holds that is not the last (activations forward) and A x M for every
// one that is not the first (gradients backward), plus T if it holds the
// first or the last virtual stage (the tied-gradient sum: the first stage
// sends its sum down, the last sends its copy up). Shape headers go once per
// boundary in the first step only, so the second step is measured. The
// engine's world reductions (loss, gradient norm) run on other groups.
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

namespace kolos {
namespace {

using testing::world_size;

struct Case {
  std::string schedule;
  int chunks;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.schedule; }

class PipelineTraffic : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineTraffic, BytesPerStepEqualTheAnalyticVolume) {
  ASSERT_EQ(testing::pmpi_interposition_problem(), "");
  const Case c = GetParam();
  // Blocks (layers + embedding + head) divide evenly into P x V stages.
  const int P = world_size(), V = c.chunks, M = 2 * P;
  RunConfig config = testing::tiny_gpt_config(
      {"model.layers=" + std::to_string(2 * P * V - 2), "train.micro_batch=2",
       "train.global_batch=" + std::to_string(2 * M), "parallel.pipeline.size=" + std::to_string(P),
       "parallel.pipeline.schedule=\"" + c.schedule + "\"",
       "parallel.pipeline.chunks=" + std::to_string(V), "train.steps=2"});
  modules::register_builtin_models();
  Engine engine(config, testing::world_group(),
                [](const RunConfig& r) { return data::make_source(r); });
  ASSERT_EQ(engine.accumulation(), M);
  engine.step();
  testing::reset_observed_traffic();
  engine.step();

  const int rank = static_cast<int>(engine.mesh().coord(Axis::kPP));
  const uint64_t A = static_cast<uint64_t>(config.train.micro_batch * config.model.seq_len *
                                           config.model.hidden * 4);
  const uint64_t T = static_cast<uint64_t>(config.model.vocab * config.model.hidden * 4);
  // Virtual stages of this rank: rank + P * chunk (the interleaved layout).
  const int S = P * V;
  uint64_t expected = 0;
  bool holds_tied = false;
  for (int chunk = 0; chunk < V; ++chunk) {
    const int vs = rank + P * chunk;
    if (vs < S - 1) expected += A * M;
    if (vs > 0) expected += A * M;
    holds_tied = holds_tied || vs == 0 || vs == S - 1;
  }
  if (holds_tied) expected += T;
  // The global gradient norm: one all_reduce of one double over the stages
  // (ring volume 2(P-1)/P of 8 bytes).
  const uint64_t norm = static_cast<uint64_t>(2 * (P - 1) * 8 / P);

  const testing::ObservedTraffic seen = testing::observed_traffic({engine.mesh().group(Axis::kPP)});
  EXPECT_EQ(seen.communicators, 1);
  EXPECT_EQ(seen.sent(), expected + norm) << c.schedule << ", pp rank " << rank << " of " << P;
  EXPECT_EQ(seen.sent(KOLOS_PMPI_SEND), expected) << "activations, gradients, the tied sum";
  EXPECT_EQ(seen.sent(KOLOS_PMPI_ALLREDUCE), norm) << "the gradient norm";
  // Every send is matched by a receive of the same size somewhere; here:
  // this rank receives what its neighbours send it, the same volume
  // mirrored (activations from the previous stage, gradients from the next).
  EXPECT_EQ(seen.kinds[KOLOS_PMPI_RECV].payload_bytes, expected) << c.schedule;
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineTraffic,
                         ::testing::Values(Case{"1f1b", 1}, Case{"zb", 1}, Case{"interleaved", 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.schedule;
                         });

}  // namespace
}  // namespace kolos
