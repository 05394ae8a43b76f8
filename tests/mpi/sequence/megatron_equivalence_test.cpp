// Sequence mode "megatron" (sequence parallelism over the tp1d group) against
// the serial run of the same model, seed and data: per-step losses within
// 1e-5 relative, every step's global gradient norm within 1e-4 relative and
// the final gathered parameters within 5e-5 absolute (testing::Tolerance).
//
// The tiny GPT has 4 heads and 16 positions: at tp 2 a rank holds 8
// positions of the residual stream and 2 heads, at tp 4 it holds 4 and 1.
// Runs are 8 steps with clipping active (optim.grad_clip = 0.05), so every
// step's gradient norm, and with it every parameter's gradient sum over the
// tensor group (norms, row biases), feeds the update.
//
// And the traffic: bytes on the tp group's communicator, observed at the MPI
// boundary by libkolos_pmpi_count, against plain tp1d's of the same model.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/engine.h"
#include "kolos/core/mesh.h"
#include "kolos/core/plugin_terms.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"
#include "observed_traffic.h"
#include "sequence_cases.h"

namespace kolos {
namespace {

// tp1d over `tp` ranks with sequence mode megatron (size left out: the
// sequence group is the tensor group), x whatever else `overrides` sets.
RunConfig megatron(int tp, std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.tensor.size=" + std::to_string(tp));
  overrides.push_back("parallel.tensor.mode=\"1d\"");
  overrides.push_back("parallel.sequence.mode=\"megatron\"");
  return testing::tiny_gpt_config(base(std::move(overrides)));
}

TEST(Megatron, MatchesSerial) {
  // tp 2 at 2 ranks, tp 4 at 4.
  REQUIRE_RANKS(2, 4);
  testing::expect_equivalent(serial(), megatron(world_size(), {"parallel.data=1"}));
}

TEST(Megatron, SizeEqualToTheTensorSizeIsTheSame) {
  // parallel.sequence.size = tp names the same group; no sp axis is added.
  REQUIRE_RANKS(2);
  const RunConfig c = megatron(2, {"parallel.sequence.size=2"});
  EXPECT_EQ(resolve_mesh_shape(c, 2).sp, 1);
  EXPECT_EQ(resolve_mesh_shape(c, 2).tp, 2);
  testing::expect_equivalent(serial(), c);
}

TEST(Megatron, WithDataParallelAndZero3MatchesSerial) {
  // tp 2 x dp 2 under ZeRO-3: parameters sharded over dp, gathered per block.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), megatron(2, {"parallel.data=2", "parallel.zero.stage=3"}));
}

TEST(Megatron, WithThePipelineMatchesSerial) {
  // tp 2 x 2 stages, 1F1B over 4 micro-batches: the stages exchange the
  // sequence-split [micro_batch, T/tp, hidden]; stages cut by measured time,
  // whose probe runs whole samples as plain tp1d.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(
      serial(), megatron(2, {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\"",
                             "parallel.pipeline.balance=\"time\""}));
}

TEST(Megatron, WithRecomputeMatchesSerial) {
  REQUIRE_RANKS(2);
  testing::expect_equivalent(serial(), megatron(2, {"train.recompute=\"selective\""}));
  testing::expect_equivalent(serial(), megatron(2, {"train.recompute=\"full\""}));
}

TEST(MegatronLlama, GroupedQueryAttentionMatchesSerial) {
  // RMSNorm weights, RoPE on the gathered sequence, SwiGLU, the untied head.
  // tp 2: 8 query heads of 2 key/value heads, 4 and 1 per rank; tp 4 (key/value
  // heads must divide over tp1d): 8 of 4, 2 and 1 per rank.
  REQUIRE_RANKS(2, 4);
  const std::vector<std::string> gqa = {
      "model.heads=8", world_size() == 2 ? "model.kv_heads=2" : "model.kv_heads=4"};
  testing::expect_equivalent(serial(llama(gqa)), megatron(world_size(), llama(gqa)));
}

TEST(MegatronLlama, WithThePipelineMatchesSerial) {
  REQUIRE_RANKS(4);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  std::vector<std::string> mix = llama(gqa);
  mix.insert(mix.end(), {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""});
  testing::expect_equivalent(serial(llama(gqa)), megatron(2, mix));
}

// Bytes sent on the tp group's communicator in one step (after the engine's
// setup), by kind.
testing::ObservedTraffic one_step_traffic(const RunConfig& config) {
  modules::register_builtin_models();
  Engine engine(config, testing::world_group(),
                [](const RunConfig& r) { return data::make_source(r); });
  testing::reset_observed_traffic();
  engine.step();
  const testing::ObservedTraffic seen = testing::observed_traffic({engine.mesh().group(Axis::kTP)});
  EXPECT_EQ(seen.communicators, 1);
  return seen;
}

uint64_t activation_bytes(const testing::ObservedTraffic& t) {
  return t.sent(KOLOS_PMPI_ALLGATHER) + t.sent(KOLOS_PMPI_REDUCE_SCATTER);
}

TEST(MegatronTraffic, PerLayerBytesEqualPlainTp1dAndTheCallsThePlannerCounts) {
  // tp 2 and 4; 2 micro-batches of 4 per step. A layer's bytes are the
  // difference of the 2-layer and 1-layer models' step, observed for both
  // modes: plain tp1d's all-reduces of [B, T, hidden] (attention's and the
  // MLP's input, backward; output, forward) against megatron's all-gathers
  // and reduce-scatters of the same tensors, each half an all-reduce.
  REQUIRE_RANKS(2, 4);
  ASSERT_EQ(testing::pmpi_interposition_problem(), "");
  const int n = world_size();
  const std::vector<std::string> shape = {"train.global_batch=8", "train.micro_batch=4",
                                          "train.steps=1", "parallel.data=1"};
  const auto plain = [&](int layers) {
    std::vector<std::string> o = shape;
    o.insert(o.end(), {"model.layers=" + std::to_string(layers),
                       "parallel.tensor.size=" + std::to_string(n), "parallel.tensor.mode=\"1d\""});
    return one_step_traffic(testing::tiny_gpt_config(o));
  };
  const auto split = [&](int layers) {
    std::vector<std::string> o = shape;
    o.push_back("model.layers=" + std::to_string(layers));
    return one_step_traffic(megatron(n, o));
  };
  const testing::ObservedTraffic plain1 = plain(1), plain2 = plain(2);
  const testing::ObservedTraffic split1 = split(1), split2 = split(2);

  // Plain tp1d moves activations by all-reduce only; megatron by all-gather
  // and reduce-scatter only, and as many bytes of each.
  EXPECT_EQ(activation_bytes(plain2), 0u);
  EXPECT_GT(activation_bytes(split2), 0u);
  EXPECT_EQ(split2.sent(KOLOS_PMPI_ALLGATHER), split2.sent(KOLOS_PMPI_REDUCE_SCATTER));

  // Per layer: the same activation bytes.
  const uint64_t plain_layer =
      plain2.sent(KOLOS_PMPI_ALLREDUCE) - plain1.sent(KOLOS_PMPI_ALLREDUCE);
  const uint64_t split_layer = activation_bytes(split2) - activation_bytes(split1);
  EXPECT_EQ(split_layer, plain_layer) << "rank " << testing::world_rank();
  // For the record, the analytic value both meet: 4 all-reduces of
  // [4, 16, 32] fp32 per micro-batch, 2 micro-batches.
  const uint64_t all_reduce = 2ull * (n - 1) * 4 * 16 * 32 * 4 / n;
  EXPECT_EQ(plain_layer, 2 * 4 * all_reduce);

  // Megatron's one addition, per layer: the gradient sums over the group of
  // the parameters whole on every rank that act on its split positions (2
  // layer norms' weight and bias, 2 row-layer biases: 6 x hidden floats), an
  // all-reduce per micro-batch each.
  const uint64_t split_sums = split2.sent(KOLOS_PMPI_ALLREDUCE) - split1.sent(KOLOS_PMPI_ALLREDUCE);
  EXPECT_EQ(split_sums, 2ull * 6 * (2ull * (n - 1) * 32 * 4 / n));
  // Whole step: the embeddings' all-reduce becomes a reduce-scatter forward
  // and an all-gather backward, the LM head's input all-reduce an all-gather
  // forward and a reduce-scatter backward, so the step's bytes are plain
  // tp1d's plus those sums (2 layers and the final norm: 14 x hidden).
  EXPECT_EQ(split2.sent(), plain2.sent() + 2ull * 14 * (2ull * (n - 1) * 32 * 4 / n));

  // The planner's account of these calls (the tp1d plugin's terms, which
  // price each call's wait on a peer) against the calls observed, per
  // layer and for the step beyond the layers' (the embedding, the head,
  // the final norm; the loss's reductions are the same in both modes, so
  // the all-reduces are compared as megatron's over plain tp1d's).
  MemoryQuery q;
  q.tp = n, q.micro_batch = 4, q.layers = "tp1d";
  q.model.hidden = 32, q.model.seq = 16, q.model.heads = 4, q.model.layers = 2;
  const auto model_calls = [&](const std::string& sequence, CallSite site, Collective op) {
    q.sequence = sequence;
    double count = 0;
    for (const CollectiveCall& c : plugin_traffic("tp1d", q)) {
      if (c.site == site && c.op == op) count += c.count;
    }
    return static_cast<uint64_t>(2 * count);  // 2 micro-batches
  };
  const auto layer_calls = [](const testing::ObservedTraffic& two,
                              const testing::ObservedTraffic& one,
                              kolos_pmpi_kind kind) { return two.calls(kind) - one.calls(kind); };
  EXPECT_EQ(layer_calls(split2, split1, KOLOS_PMPI_ALLGATHER),
            model_calls("megatron", CallSite::kBlock, Collective::kAllGather));
  EXPECT_EQ(layer_calls(split2, split1, KOLOS_PMPI_REDUCE_SCATTER),
            model_calls("megatron", CallSite::kBlock, Collective::kReduceScatter));
  EXPECT_EQ(layer_calls(split2, split1, KOLOS_PMPI_ALLREDUCE),
            model_calls("megatron", CallSite::kBlock, Collective::kAllReduce));
  EXPECT_EQ(layer_calls(plain2, plain1, KOLOS_PMPI_ALLREDUCE),
            model_calls("", CallSite::kBlock, Collective::kAllReduce));
  for (const auto& [kind, op] :
       {std::pair{KOLOS_PMPI_ALLGATHER, Collective::kAllGather},
        std::pair{KOLOS_PMPI_REDUCE_SCATTER, Collective::kReduceScatter}}) {
    EXPECT_EQ(split1.calls(kind) - layer_calls(split2, split1, kind),
              model_calls("megatron", CallSite::kEmbedding, op) +
                  model_calls("megatron", CallSite::kHead, op));
  }
  const auto outside = [&](const std::string& sequence) {
    return static_cast<int64_t>(
        model_calls(sequence, CallSite::kEmbedding, Collective::kAllReduce) +
        model_calls(sequence, CallSite::kHead, Collective::kAllReduce));
  };
  const auto seen_outside = [&](const testing::ObservedTraffic& two,
                                const testing::ObservedTraffic& one) {
    return static_cast<int64_t>(one.calls(KOLOS_PMPI_ALLREDUCE) -
                                layer_calls(two, one, KOLOS_PMPI_ALLREDUCE));
  };
  EXPECT_EQ(seen_outside(split2, split1) - seen_outside(plain2, plain1),
            outside("megatron") - outside(""));
}

}  // namespace
}  // namespace kolos
