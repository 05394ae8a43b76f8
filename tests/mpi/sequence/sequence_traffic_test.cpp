// Bytes each sequence plugin sends per layer in a training run equal its
// analytic formula (docs/sequence-parallel.md), on every rank. The bytes are
// observed at the MPI boundary by libkolos_pmpi_count
// (tests/support/observed_traffic.h says what "sent" means per call) on the
// communicator of the mesh's sp group, the one the plugins use (and, under
// hybrid, on the Ulysses and ring subgroups it splits from it); the
// gradients role reduces on the dp×sp group's own communicator and the
// engine's loss and timing on the world's, so neither is counted here.
//
// Per layer, micro-batch and rank, with t = seq_len / sp tokens, h heads
// after the grouped-query repeat, d = hidden / heads, X = B*h*t*d elements
// and e = 4 bytes (float32):
//   ulysses  forward 4 X e (sp-1)/sp, backward the same (all-to-alls)
//   ring     forward (sp-1) (2 X e + 8 t), backward the same + sp 2 X 4
//   hybrid   Ulysses degree a = 2, ring degree r = sp / 2: forward
//            4 X e (a-1)/a + (r-1) (2 X e + 8 t a), backward the same
//            + r 2 X 4 when r > 1
#include <gtest/gtest.h>
#include <mpi.h>

#include <array>
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
  std::string mode;
  std::string model;  // "gpt", or "llama" with 2 key/value heads of 4
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.mode << " " << c.model; }

// The formula of docs/sequence-parallel.md, forward plus backward.
uint64_t bytes_per_layer(const std::string& mode, int64_t sp, int64_t batch, int64_t heads,
                         int64_t t, int64_t d) {
  const int64_t x = batch * heads * t * d, e = 4;
  if (mode == "ulysses") return static_cast<uint64_t>(2 * 4 * x * e * (sp - 1) / sp);
  if (mode == "hybrid") {
    const int64_t a = 2, r = sp / a;
    const int64_t forward = 4 * x * e * (a - 1) / a + (r - 1) * (2 * x * e + 8 * t * a);
    return static_cast<uint64_t>(2 * forward + (r > 1 ? r * 2 * x * 4 : 0));
  }
  const int64_t ring = (sp - 1) * (2 * x * e + 8 * t);
  return static_cast<uint64_t>(2 * ring + sp * 2 * x * 4);
}

class SequenceTraffic : public ::testing::TestWithParam<Case> {};

TEST_P(SequenceTraffic, BytesPerLayerEqualTheFormula) {
  const Case c = GetParam();
  ASSERT_EQ(testing::pmpi_interposition_problem(), "");
  const int64_t sp = world_size();
  // 2 micro-batches of 4 per step; 3 layers so that a per-layer count is
  // not a per-step one by accident.
  std::vector<std::string> overrides = {"parallel.data=1",
                                        "parallel.sequence.size=" + std::to_string(sp),
                                        "parallel.sequence.mode=\"" + c.mode + "\"",
                                        "train.global_batch=8",
                                        "train.micro_batch=4",
                                        "train.steps=2",
                                        "model.layers=3"};
  if (c.mode == "hybrid") overrides.push_back("parallel.sequence.ulysses=2");
  if (c.model == "llama") {
    overrides.insert(overrides.end(), {"model.name=llama", "model.vocab=65", "model.kv_heads=2"});
  }
  const RunConfig config = testing::tiny_gpt_config(overrides);
  modules::register_builtin_models();
  Engine engine(config, testing::world_group(),
                [](const RunConfig& r) { return data::make_source(r); });
  const int64_t layers = config.model.layers, heads = config.model.heads;
  const int64_t t = config.model.seq_len / sp, d = config.model.hidden / heads;
  const uint64_t per_layer = bytes_per_layer(c.mode, sp, config.train.micro_batch, heads, t, d);
  for (int step = 0; step < 2; ++step) {
    testing::reset_observed_traffic();
    engine.step();
    const comm::ProcessGroupPtr& group = engine.mesh().group(Axis::kSP);
    testing::ObservedTraffic seen = testing::observed_traffic({group});
    // The counter knows a communicator once it carries traffic: under
    // hybrid the sp group's carries none, its subgroups' all of it.
    EXPECT_EQ(seen.communicators, c.mode == "hybrid" ? 0 : 1);
    if (c.mode == "hybrid") {
      // The subgroups hybrid.cpp splits from the sp group, by name; a ring
      // of one rank sends nothing.
      for (const std::string sub : {"/ulysses", "/ring"}) {
        std::array<kolos_pmpi_count, KOLOS_PMPI_KINDS> counts{};
        const int found = kolos_pmpi_counts_by_name(
            testing::mpi_name_of(group->name() + sub).c_str(), counts.data());
        if (sub == "/ulysses" || sp > 2) EXPECT_EQ(found, 1) << sub;
        for (int k = 0; k < KOLOS_PMPI_KINDS; ++k) seen.kinds[k].sent_bytes += counts[k].sent_bytes;
      }
    }
    const uint64_t micro_batches = static_cast<uint64_t>(engine.accumulation());
    EXPECT_EQ(seen.sent() % (layers * micro_batches), 0u);
    EXPECT_EQ(seen.sent() / (layers * micro_batches), per_layer)
        << c.mode << " " << c.model << " at sp " << sp << ", step " << step << ", rank "
        << engine.mesh().rank();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SequenceTraffic,
                         ::testing::Values(Case{"ulysses", "gpt"}, Case{"ulysses", "llama"},
                                           Case{"ring", "gpt"}, Case{"ring", "llama"},
                                           Case{"hybrid", "gpt"}, Case{"hybrid", "llama"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.mode + "_" + info.param.model;
                         });

}  // namespace
}  // namespace kolos
