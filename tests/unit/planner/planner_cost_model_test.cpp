// The cost model's pieces against hand-computed values and closed forms.
#include <gtest/gtest.h>

#include "kolos/planner/cost_model.h"
#include "planner_fixtures.h"

using namespace kolos::planner;

namespace {

ModelShape small_gpt() {
  ModelShape m;
  m.layers = 2, m.hidden = 64, m.heads = 4, m.seq_len = 16, m.vocab = 100;
  return m;
}

Machine test_machine() { return fixtures::test_machine(4); }

}  // namespace

TEST(PlannerCostModel, FlopsOfASmallGpt) {
  const ModelShape m = small_gpt();
  const BlockFlops f = block_forward_flops(m, 2);
  // 24·b·s·h² = 24·2·16·64² and 4·b·s²·h = 4·2·16²·64.
  EXPECT_DOUBLE_EQ(f.gemm, 3145728.0);
  EXPECT_DOUBLE_EQ(f.attention, 131072.0);
  // 2·b·s·h·V = 2·2·16·64·100.
  EXPECT_DOUBLE_EQ(logit_forward_flops(m, 2), 409600.0);
  // 12h² + 13h per block; (V + s)·h embeddings; 2h final norm.
  EXPECT_DOUBLE_EQ(m.block_params(), 49984.0);
  EXPECT_DOUBLE_EQ(m.total_params(), 2 * 49984.0 + 116 * 64 + 128);
  // Narayanan et al.'s count: 96·B·s·l·h²·(1 + s/6h + V/16lh) = 4 x (fwd) with recompute.
  const double expected = 96.0 * 8 * 16 * 2 * 64 * 64 * (1 + 16.0 / 384 + 100.0 / 2048);
  EXPECT_DOUBLE_EQ(megatron_step_flops(m, 8), expected);
  // ...which is four forward passes of the blocks (recomputation) and three of the
  // logit layer: 4·L·(24bsh² + 4bs²h) + 3·2bshV.
  const BlockFlops f8 = block_forward_flops(m, 8);
  EXPECT_NEAR(megatron_step_flops(m, 8), 4 * 2 * f8.total() + 3 * logit_forward_flops(m, 8), 1e-3);
  // Grouped-query attention shrinks k and v only: kv_heads 1 of 4 heads.
  ModelShape gqa = m;
  gqa.kv_heads = 1;
  EXPECT_DOUBLE_EQ(block_forward_flops(gqa, 2).gemm,
                   2 * 2 * 16 * 64 * (2 * 64 + 2 * 16) + 4 * 2 * 16 * 64 * 256.0);
}

TEST(PlannerCostModel, BubbleOfEachScheduleMatchesItsClosedForm) {
  for (int64_t P : {2, 4, 8}) {
    for (int64_t M : {P, 2 * P, 4 * P}) {
      for (Schedule kind : {Schedule::kGPipe, Schedule::k1F1B}) {
        std::vector<StageTimes> st(P, StageTimes{1, 2, 1, 1});
        double busy = 0;
        const double span = simulate_schedule(kind, P, M, 1, st, 0, &busy);
        EXPECT_NEAR(1 - busy / span, static_cast<double>(P - 1) / (M + P - 1), 1e-9)
            << to_string(kind) << " P=" << P << " M=" << M;
        EXPECT_NEAR(1 - busy / span, bubble_fraction(kind, P, M, 1, 1, 1, 1), 1e-9);
      }
      for (int64_t V : {2, 4}) {
        std::vector<StageTimes> st(P * V, StageTimes{1.0 / V, 2.0 / V, 1, 1});
        double busy = 0;
        const double span = simulate_schedule(Schedule::kInterleaved, P, M, V, st, 0, &busy);
        EXPECT_NEAR(1 - busy / span, static_cast<double>(P - 1) / (V * M + P - 1), 1e-9)
            << "interleaved P=" << P << " M=" << M << " V=" << V;
      }
      // ZB-H1 with F = BI = W: (P-1)(F+BI-W) / (M(F+BI+W) + (P-1)(F+BI-W)).
      std::vector<StageTimes> st(P, StageTimes{1, 2, 1, 1});
      double busy = 0;
      const double span = simulate_schedule(Schedule::kZeroBubble, P, M, 1, st, 0, &busy);
      const double zb = (P - 1.0) / (3.0 * M + P - 1.0);
      EXPECT_NEAR(1 - busy / span, zb, 1e-9) << "zb P=" << P << " M=" << M;
      EXPECT_NEAR(bubble_fraction(Schedule::kZeroBubble, P, M, 1, 1, 1, 1), zb, 1e-12);
    }
  }
}

TEST(PlannerCostModel, TransfersLengthenThePipeline) {
  const int64_t P = 4, M = 8;
  std::vector<StageTimes> st(P, StageTimes{1, 2, 1, 1});
  const double base = simulate_schedule(Schedule::k1F1B, P, M, 1, st, 0, nullptr);
  const double slow = simulate_schedule(Schedule::k1F1B, P, M, 1, st, 0.1, nullptr);
  // At least the fill and the drain: (P-1) hops forward, (P-1) back.
  EXPECT_GE(slow - base, 2 * (P - 1) * 0.1 - 1e-9);
  // A slower last stage (the logits) paces the whole pipeline.
  std::vector<StageTimes> heavy = st;
  heavy.back() = StageTimes{2, 4, 2, 2};
  double busy = 0;
  const double span = simulate_schedule(Schedule::k1F1B, P, M, 1, heavy, 0, &busy);
  EXPECT_DOUBLE_EQ(busy, M * 6.0);
  EXPECT_GT(span, base);
}

TEST(PlannerCostModel, CollectivesFollowThePlacement) {
  const Machine m = test_machine();
  const double X = 1e9;
  // Inside a node: the ring at the intra figures.
  EXPECT_DOUBLE_EQ(collective_time(m, Collective::kAllReduce, X, 8, 1),
                   2 * 7 * 1e-6 + 2 * 7.0 / 8 * X / 100e9);
  EXPECT_DOUBLE_EQ(collective_time(m, Collective::kAllGather, X, 4, 2),
                   3 * 1e-6 + 3.0 / 4 * X / 100e9);
  // One rank per node (stride 8): the ring at the inter figures.
  EXPECT_DOUBLE_EQ(collective_time(m, Collective::kAllReduce, X, 4, 8),
                   2 * 3 * 1e-5 + 2 * 3.0 / 4 * X / 10e9);
  // Two nodes of 8: reduce-scatter inside, all-reduce of 1/8 across, all-gather inside.
  const double hier = (7 * 1e-6 + 7.0 / 8 * X / 100e9) + (2 * 1e-5 + X / 8 / 10e9) +
                      (7 * 1e-6 + 7.0 / 8 * X / 100e9);
  EXPECT_DOUBLE_EQ(collective_time(m, Collective::kAllReduce, X, 16, 1), hier);
  EXPECT_LT(hier, collective_time(m, Collective::kAllReduce, X, 16, 8 * 0 + 8) * 10);
  EXPECT_DOUBLE_EQ(collective_time(m, Collective::kSendRecv, X, 2, 16), 1e-5 + X / 10e9);
  EXPECT_EQ(collective_time(m, Collective::kAllReduce, X, 1, 1), 0.0);
  EXPECT_FALSE(spans_nodes(m.cluster, 8, 1));
  EXPECT_TRUE(spans_nodes(m.cluster, 2, 8));
  EXPECT_TRUE(spans_nodes(m.cluster, 16, 1));
  EXPECT_FALSE(spans_nodes(m.cluster, 2, 4, 0));
  EXPECT_TRUE(spans_nodes(m.cluster, 2, 4, 4));  // ranks 4 and 8
}

TEST(PlannerCostModel, MemoryFollowsZeroRecomputeAndPipeline) {
  Workload w;
  w.model.layers = 24, w.model.hidden = 2048, w.model.heads = 16, w.model.seq_len = 2048;
  w.model.vocab = 51200;
  w.global_batch = 64;
  Candidate c;
  c.dp = 8, c.micro_batch = 1, c.microbatches = 8;
  std::vector<MemoryPart> parts;
  const double dp = memory_per_rank(w, c, &parts);
  ASSERT_EQ(parts.size(), 7u);  // 3 states, activations, temporaries, allocator, runtime
  EXPECT_EQ(parts[0].name, "parameters");
  // bf16: parameters and gradients 2 B each, AdamW m, v and the master 12 B.
  const double P = w.model.total_params();
  EXPECT_DOUBLE_EQ(parts[0].bytes, 2 * P);
  EXPECT_DOUBLE_EQ(parts[2].bytes, 12 * P);
  double previous = dp;
  for (int zero = 1; zero <= 3; ++zero) {
    c.zero = zero;
    const double z = memory_per_rank(w, c, nullptr);
    EXPECT_LT(z, previous) << "zero" << zero;
    previous = z;
  }
  c.zero = 0;
  c.recompute = Recompute::kSelective;
  const double selective = memory_per_rank(w, c, nullptr);
  c.recompute = Recompute::kFull;
  const double full = memory_per_rank(w, c, nullptr);
  EXPECT_LT(selective, dp);
  EXPECT_LT(full, selective);
  // GPipe holds every micro-batch, 1F1B at most the stage count.
  c.recompute = Recompute::kNone;
  c.pp = 4, c.dp = 2, c.microbatches = 32;
  c.schedule = Schedule::kGPipe;
  const double gpipe = memory_per_rank(w, c, nullptr);
  c.schedule = Schedule::k1F1B;
  EXPECT_LT(memory_per_rank(w, c, nullptr), gpipe);
}

TEST(PlannerCostModel, PredictionAddsUp) {
  Workload w;
  w.model.layers = 24, w.model.hidden = 2048, w.model.heads = 16, w.model.seq_len = 2048;
  w.model.vocab = 51200;
  w.global_batch = 64;
  const Machine m = test_machine();
  Candidate c;
  c.pp = 2, c.dp = 4, c.tp = 4, c.schedule = Schedule::k1F1B, c.micro_batch = 2;
  c.microbatches = 8;
  const Prediction p = predict(w, m, c);
  EXPECT_NEAR(p.step, p.compute + p.comm + p.bubble + p.optimizer + p.offload, 1e-12);
  EXPECT_GT(p.compute, 0);
  EXPECT_GT(p.bubble, 0);
  EXPECT_GT(p.bytes_tp, 0);
  EXPECT_GT(p.bytes_dp, 0);
  EXPECT_GT(p.bytes_pp, 0);
  EXPECT_DOUBLE_EQ(p.bytes_sent, p.bytes_tp + p.bytes_sp + p.bytes_dp + p.bytes_pp);
  // tp 4 inside a node; dp (ranks 0, 4, 8, 12) and pp (0, 16) across nodes.
  EXPECT_EQ(p.crossing_groups, 2);
  // The closed-form pass and the simulation agree within the transfers.
  const Prediction q = predict(w, m, c, false);
  EXPECT_NEAR(q.step, p.step, 0.05 * p.step);
}

// ZeRO's copies around its collectives (unpacking gathered rows into the
// parameters, packing gradients into zeroed staging, adding the reduced
// shard) are priced at the elementwise rate and never hidden: halving that
// rate's time adds to the communication exactly what the copies cost, per
// micro-batch for stages 2 and 3, once a step for the gathers after the
// optimizer; data parallelism's all-reduce copies nothing.
TEST(PlannerCostModel, ZeroCopiesArePricedAtTheElementwiseRate) {
  const Workload w = fixtures::small_workload();
  Machine fast = test_machine(), slow = test_machine();
  slow.rates.elementwise_bytes = fast.rates.elementwise_bytes / 2;
  Candidate c;
  c.dp = 4, c.micro_batch = 4, c.microbatches = 4;
  double added[4];
  for (int zero = 0; zero <= 3; ++zero) {
    c.zero = zero;
    added[zero] = predict(w, slow, c).comm - predict(w, fast, c).comm;
  }
  EXPECT_DOUBLE_EQ(added[0], 0);
  // Per byte of the parameters, at the fast rate (the slow one adds as much
  // again): stage 1 its gather's 2; stage 2 four micro-batches' 3 + 3/4 and
  // the gather's 2; stage 3 four micro-batches' two gathers (2 each) and
  // 3 + 3/4.
  const double per_byte = w.element_bytes() * w.model.total_params() / fast.rates.elementwise_bytes;
  EXPECT_NEAR(added[1], 2 * per_byte, 1e-3 * per_byte);
  EXPECT_NEAR(added[2], (4 * 3.75 + 2) * per_byte, 1e-3 * per_byte);
  EXPECT_NEAR(added[3], 4 * (4 + 3.75) * per_byte, 1e-3 * per_byte);
}

TEST(PlannerCostModel, SharedCoresReplayTheScheduleWithProcessorSharing) {
  // Enough cores: the same makespan as the plain replay.
  const std::vector<StageTimes> stages(2, StageTimes{1.0, 2.0, 1.0, 1.0});
  for (const Schedule kind : {Schedule::kGPipe, Schedule::k1F1B}) {
    double busiest = 0;
    const double plain = simulate_schedule(kind, 2, 4, 1, stages, 0.25, &busiest);
    EXPECT_DOUBLE_EQ(simulate_schedule_shared(kind, 2, 4, 1, stages, 0.25, 2.0), plain);
  }
  // One core for two ranks, no transfer delay: some rank always computes,
  // so the step is the total work (2 ranks x 4 micro-batches x 3 s) on one core.
  EXPECT_NEAR(simulate_schedule_shared(Schedule::kGPipe, 2, 4, 1, stages, 0.0, 1.0), 24.0, 1e-9);
  // Half a core each way: between the total work over the cores and the plain makespan.
  double busiest = 0;
  const double plain = simulate_schedule(
      Schedule::k1F1B, 4, 8, 1, std::vector<StageTimes>(4, {1.0, 2.0, 1.0, 1.0}), 0.0, &busiest);
  const double shared = simulate_schedule_shared(
      Schedule::k1F1B, 4, 8, 1, std::vector<StageTimes>(4, {1.0, 2.0, 1.0, 1.0}), 0.0, 2.0);
  EXPECT_GE(shared, 4 * 8 * 3.0 / 2.0 - 1e-9);
  EXPECT_GE(shared, plain - 1e-9);
}

// kolos's own flat and hierarchical all-reduce (MPI backend) on a cluster
// whose nodes each have one shared link, the namespace cluster's file.
TEST(PlannerCostModel, MpiAllReducePathsOnSharedNodeLinks) {
  const ClusterFile f = load_cluster(std::string(KOLOS_SOURCE_DIR) +
                                     "/examples/clusters/netns-2x2.toml");
  const Cluster& c = f.cluster;
  ASSERT_EQ(c.devices_per_node, 2);
  const double B = 64.0 * (1 << 20), link = 2 * 62.5e6, bi = 0.75e9;
  const AllReducePaths t = mpi_all_reduce_paths(c, B, 4);
  // Flat: a ring over 4, 1.5 B through the node link.
  EXPECT_DOUBLE_EQ(t.flat, 6 * 50e-6 + 1.5 * B / link);
  // Hierarchical: reduce and broadcast inside (2 steps, B each over 2
  // ranks), the leaders' ring of 2 moves B across.
  const double inside = 2 * 5e-6 + B / bi;
  EXPECT_DOUBLE_EQ(t.hierarchical, inside + (2 * 50e-6 + B / link) + inside);
  EXPECT_LT(t.hierarchical, t.flat);  // the link dominates at 64 MiB
  // One node: both are the ring inside it.
  const AllReducePaths one = mpi_all_reduce_paths(c, B, 2);
  EXPECT_DOUBLE_EQ(one.flat, one.hierarchical);
  EXPECT_DOUBLE_EQ(one.flat, 2 * 5e-6 + B / bi);
  // Nothing to reduce.
  EXPECT_EQ(mpi_all_reduce_paths(c, B, 1).flat, 0.0);
  EXPECT_EQ(mpi_all_reduce_paths(c, 0, 4).hierarchical, 0.0);
}
