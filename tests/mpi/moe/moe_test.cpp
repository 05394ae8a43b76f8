// Mixture of experts (model.name = "mixtral"; modules/src/llama/llama.cpp):
// the layer, and training equal to the serial run. Serving, the routing
// metrics, the chunks memory plugin, auxiliary-loss-free balancing and bad
// input are in moe_features_test.cpp; the shared helpers, in moe_test_util.h.
//
// - The layer: with top_k = experts and no capacity, its output is every
//   expert's output weighted by the router's softmax (the dense sum), so
//   dispatch and combine lose and repeat nothing; with top_k < experts, the
//   same sum over each token's top_k, renormalised.
// - The load-balancing loss reaches the router through with_aux_loss: its
//   gradient equals the gradient of the same loss added to the model's.
// - Equivalence with the serial run (20 steps, the harness's tolerances):
//   dp, zero1-3, tp1d (x dp), pipeline 1f1b, full recomputation, a
//   capacity that drops tokens, moe_every = 2 with the z-loss. A dp rank's
//   micro-batch holds the samples of one serial micro-batch of the same
//   size (Engine::next_micro_batches), so the per-micro-batch routing, loss
//   and drops are the serial run's.
// - Expert parallelism (parallel.expert.size, the ep axis; experts.h):
//   run_experts() with identity experts returns its input exactly, each row
//   reaches the expert it was routed to, and experts that receive no rows
//   get zero gradients without a hang; the all-to-alls hand MPI exactly the
//   routed rows (libkolos_pmpi_count); training equals the serial run under
//   ep 2 and 4, dp x ep, ep x tp1d, ep x pipeline, recomputation with a
//   capacity; a checkpoint saved at one ep size loads at another.
// - router = "sigmoid" and shared experts: the layer equals its dense
//   mixture, and training equals the serial run under dp x ep and tp1d.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "equivalence.h"
#include "moe_test_util.h"
#include "observed_traffic.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/aux_loss.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/experts.h"
#include "kolos/core/mesh.h"
#include "kolos/core/model.h"
#include "kolos/core/training_state.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

using namespace moe_test;
using testing::world_size;

// ---- the layer ----------------------------------------------------------------

TEST(MoeLayer, AllExpertsEqualTheDenseMixture) {
  REQUIRE_RANKS(1);
  const RunConfig c = serial({"model.top_k=4"});
  Built b = build(c);
  Moe m = moe_of(*b.model, 4);
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({2, 5, 32});
  const at::Tensor flat = x.reshape({-1, 32});
  const at::Tensor probs = torch::softmax(torch::matmul(flat, m.router.t()), -1);
  at::Tensor dense = torch::zeros_like(flat);
  for (int64_t e = 0; e < 4; ++e) {
    dense += m.experts[e]->forward(flat) * probs.select(1, e).unsqueeze(-1);
  }
  const at::Tensor out = m.layer->forward(x);
  EXPECT_EQ(out.sizes(), x.sizes());
  EXPECT_TRUE(torch::allclose(out.reshape({-1, 32}), dense, 1e-5, 1e-6))
      << (out.reshape({-1, 32}) - dense).abs().max().item<double>();
}

TEST(MoeLayer, SigmoidScoresWithSharedExpertsEqualTheirDenseMixture) {
  REQUIRE_RANKS(1);
  const RunConfig c =
      serial({"model.top_k=4", "model.router=\"sigmoid\"", "model.shared_experts=2"});
  Built b = build(c);
  Moe m = moe_of(*b.model, 4);
  auto* shared = dynamic_cast<Layer*>(&child(*b.model->blocks()[1].second, "mlp.shared"));
  ASSERT_NE(shared, nullptr);
  // Two experts' width: gate_proj is [2 x ffn_hidden, hidden].
  EXPECT_EQ(child(*shared, "gate_proj").named_parameters()["weight"].size(0),
            2 * c.model.ffn_hidden);
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({2, 5, 32});
  const at::Tensor flat = x.reshape({-1, 32});
  // Every expert chosen: the sigmoid scores renormalised over all of them.
  const at::Tensor scores = torch::sigmoid(torch::matmul(flat, m.router.t()));
  const at::Tensor weights = scores / scores.sum(-1, /*keepdim=*/true);
  at::Tensor dense = shared->forward(flat);
  for (int64_t e = 0; e < 4; ++e) {
    dense += m.experts[e]->forward(flat) * weights.select(1, e).unsqueeze(-1);
  }
  const at::Tensor out = m.layer->forward(x).reshape({-1, 32});
  EXPECT_TRUE(torch::allclose(out, dense, 1e-5, 1e-6)) << (out - dense).abs().max().item<double>();
}

TEST(MoeLayer, TopTwoIsTheRenormalisedSumOverEachTokensChoices) {
  REQUIRE_RANKS(1);
  const RunConfig c = serial();
  Built b = build(c);
  Moe m = moe_of(*b.model, 4);
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({3, 4, 32});
  const at::Tensor flat = x.reshape({-1, 32});
  const at::Tensor probs = torch::softmax(torch::matmul(flat, m.router.t()), -1);
  at::Tensor expected = torch::zeros_like(flat);
  for (int64_t t = 0; t < flat.size(0); ++t) {
    auto [top, idx] = probs[t].topk(2);
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t e = idx[j].item<int64_t>();
      expected[t] += m.experts[e]->forward(flat[t].unsqueeze(0))[0] * (top[j] / top.sum());
    }
  }
  const at::Tensor out = m.layer->forward(x).reshape({-1, 32});
  EXPECT_TRUE(torch::allclose(out, expected, 1e-5, 1e-6))
      << (out - expected).abs().max().item<double>();
}

TEST(MoeLayer, TheLoadBalancingLossTrainsTheRouterAsIfAddedToTheLoss) {
  REQUIRE_RANKS(1);
  const RunConfig c = serial({"model.aux_loss_coef=0.3", "model.z_loss_coef=0.01"});
  Built b = build(c);
  Moe m = moe_of(*b.model, 4);
  const at::Tensor x = torch::randn({2, 6, 32});
  // kolos: the layer's output carries the auxiliary loss; the objective
  // is sum(out * g) for a fixed g, with multiplier 0.5.
  const at::Tensor g = torch::randn({2, 6, 32});
  set_aux_loss_multiplier(0.5);
  (m.layer->forward(x) * g).sum().mul(0.5).backward();
  const at::Tensor kolos_grad = m.router.grad().clone();
  m.router.mutable_grad().zero_();
  // The reference: the same objective with the losses written out.
  const at::Tensor flat = x.reshape({-1, 32});
  const at::Tensor logits = torch::matmul(flat, m.router.t());
  const at::Tensor probs = torch::softmax(logits, -1);
  const at::Tensor choice = std::get<1>(probs.topk(2, -1));
  const at::Tensor fraction = torch::one_hot(choice, 4).to(at::kFloat).mean(0);  // [k, E]
  const at::Tensor aux = 0.3 * 4 * (fraction * probs.mean(0)).sum() +
                         0.01 * torch::logsumexp(logits, -1).pow(2).mean();
  set_aux_loss_multiplier(1.0);
  {
    // The layer without its auxiliary losses: coefficients 0.
    RunConfig plain = c;
    plain.model.aux_loss_coef = 0;
    plain.model.z_loss_coef = 0;
    Built p = build(plain);  // the same seed: the same weights
    Moe pm = moe_of(*p.model, 4);
    ((pm.layer->forward(x) * g).sum().mul(0.5) + aux.mul(0.5)).backward();
    // The aux graph above read m.router; its gradient lands there.
    const at::Tensor reference = pm.router.grad() + m.router.grad();
    EXPECT_TRUE(torch::allclose(kolos_grad, reference, 1e-5, 1e-7))
        << (kolos_grad - reference).abs().max().item<double>();
    // And the auxiliary part is not negligible here.
    EXPECT_GT(m.router.grad().abs().max().item<double>(), 1e-3);
  }
}

// ---- equivalence ----------------------------------------------------------------

TEST(MoeDataParallel, MatchesSerial) {
  REQUIRE_RANKS(2, 4);
  testing::expect_equivalent(serial(), parallel({dp_all()}));
}

TEST(MoeZero, EveryStageMatchesSerial) {
  REQUIRE_RANKS(2, 4);
  // Every stage over 2 ranks; stage 3, the one that gathers, over 4 too.
  for (const int stage : world_size() == 2 ? std::vector<int>{1, 2, 3} : std::vector<int>{3}) {
    SCOPED_TRACE("zero" + std::to_string(stage));
    testing::expect_equivalent(
        serial(), parallel({dp_all(), "parallel.zero.stage=" + std::to_string(stage)}));
  }
}

TEST(MoeTp1d, MatchesSerial) {
  REQUIRE_RANKS(2, 4);
  testing::expect_equivalent(
      serial(), parallel({"parallel.tensor.size=2", "parallel.data=" +
                                                        std::to_string(world_size() / 2)}));
}

TEST(MoePipeline, OneFOneBMatchesSerial) {
  REQUIRE_RANKS(2, 4);
  testing::expect_equivalent(serial(),
                             parallel({"parallel.pipeline.size=2", "parallel.data=" +
                                                                       std::to_string(world_size() / 2)}));
}

TEST(MoeRecompute, FullMatchesSerial) {
  REQUIRE_RANKS(2);
  testing::expect_equivalent(serial(), parallel({dp_all(), "train.recompute=full"}));
}

TEST(MoeCapacity, DroppedTokensMatchSerial) {
  // Capacity 0.5 x 16 tokens x 2 / 4 experts = 2 per expert and micro-batch
  // of 4 x 32 tokens... (128 tokens: capacity 32 of 64 assignments each on
  // average): many assignments dropped, the same ones in every layout.
  REQUIRE_RANKS(2, 4);
  const std::vector<std::string> cap = {"model.capacity_factor=0.5"};
  std::vector<std::string> mix = cap;
  mix.push_back(dp_all());
  testing::expect_equivalent(serial(cap), parallel(mix));
}

TEST(MoeEveryOtherBlock, WithZLossUnderTp1dMatchesSerial) {
  REQUIRE_RANKS(2);
  const std::vector<std::string> every = {"model.layers=4", "model.moe_every=2",
                                          "model.z_loss_coef=0.001"};
  std::vector<std::string> mix = every;
  mix.push_back("parallel.tensor.size=2");
  testing::expect_equivalent(serial(every), parallel(mix));
}

// ---- expert parallelism ---------------------------------------------------------

// A mesh whose ep axis is the whole world.
std::unique_ptr<DeviceMesh> expert_mesh() {
  MeshShape shape;
  shape.set(expert_axis(), world_size());
  return std::make_unique<DeviceMesh>(testing::world_group(), shape);
}

TEST(MoeExpertDispatch, CombineAfterDispatchReturnsTheInputAndReachesEachExpert) {
  REQUIRE_RANKS(2, 4);
  auto mesh = expert_mesh();
  const int64_t experts = 2 * world_size();
  const int rank = testing::world_rank();
  const ExpertShard shard = local_experts(mesh.get(), experts);
  ASSERT_EQ(shard.count, 2);
  ASSERT_EQ(shard.first, 2 * rank);
  // Rank r routes r + 1 rows to expert e when e + r is odd, none otherwise.
  std::vector<int64_t> counts(experts);
  for (int64_t e = 0; e < experts; ++e) counts[e] = (e + rank) % 2 ? rank + 1 : 0;
  int64_t m = 0;
  for (int64_t c : counts) m += c;
  torch::manual_seed(11 + rank);
  const at::Tensor rows = torch::randn({m, 3}, torch::kDouble);
  // Unit experts: the rows come back exactly.
  const at::Tensor same =
      run_experts(rows, counts, shard, [](int64_t, const at::Tensor& x) { return x; });
  EXPECT_TRUE(torch::equal(same, rows));
  // Expert e multiplies by e + 1: each row reached its own expert.
  const at::Tensor scaled = run_experts(rows, counts, shard, [&](int64_t j, const at::Tensor& x) {
    return x * static_cast<double>(shard.first + j + 1);
  });
  at::Tensor expected = rows.clone();
  for (int64_t e = 0, at = 0; e < experts; at += counts[e], ++e) {
    expected.narrow(0, at, counts[e]).mul_(static_cast<double>(e + 1));
  }
  EXPECT_TRUE(torch::equal(scaled, expected));
}

TEST(MoeExpertDispatch, ExpertsWithoutRowsGetZeroGradientsAndNothingWaits) {
  REQUIRE_RANKS(2, 4);
  auto mesh = expert_mesh();
  const int64_t experts = world_size();
  const ExpertShard shard = local_experts(mesh.get(), experts);
  // Every rank routes all its rows to expert 0: the others get none.
  std::vector<int64_t> counts(experts, 0);
  counts[0] = 5;
  const at::Tensor rows = torch::randn({5, 4}, torch::kDouble).requires_grad_(true);
  const at::Tensor scale = torch::full({4}, 2.0, torch::kDouble).requires_grad_(true);
  const at::Tensor y = run_experts(rows, counts, shard, [&](int64_t, const at::Tensor& x) {
    return x * scale;  // this rank's one expert
  });
  y.sum().backward();
  ASSERT_TRUE(scale.grad().defined());
  if (shard.first == 0) {
    // Expert 0 ran on every rank's rows: its gradient is their column sums.
    EXPECT_GT(scale.grad().abs().sum().item<double>(), 0.0);
  } else {
    EXPECT_EQ(scale.grad().abs().sum().item<double>(), 0.0);
  }
  // The rows' gradient came back through the inverse exchange: d(sum)/dx = scale.
  EXPECT_TRUE(torch::allclose(rows.grad(), torch::full({5, 4}, 2.0, torch::kDouble)));
}

// The bytes the exchanges hand MPI (libkolos_pmpi_count, at the MPI
// boundary) equal what the routing implies: per forward, the counts (L
// int64 to each other rank) and each routed row once to its expert's rank
// and once back; per backward, each row's gradient both ways again. Rows
// routed to this rank's own experts never reach the network.
TEST(MoeExpertDispatch, AllToAllBytesAreTheRoutedRows) {
  REQUIRE_RANKS(2, 4);
  ASSERT_EQ(testing::pmpi_interposition_problem(), "");
  auto mesh = expert_mesh();
  const int64_t peers = world_size(), local = 3, experts = peers * local, hidden = 5;
  const ExpertShard shard = local_experts(mesh.get(), experts);
  const int rank = testing::world_rank();
  // Uneven routing, some experts with none: rank r sends (e * 7 + r) % 5 rows to expert e.
  std::vector<int64_t> counts(experts);
  int64_t rows_total = 0;
  for (int64_t e = 0; e < experts; ++e) rows_total += counts[e] = (e * 7 + rank) % 5;
  const at::Tensor rows = torch::randn({rows_total, hidden}).requires_grad_(true);
  // What this rank sends to others and receives from them.
  uint64_t out_rows = 0, in_rows = 0;
  for (int64_t e = 0; e < experts; ++e) {
    if (e / local != rank) out_rows += static_cast<uint64_t>(counts[e]);
  }
  for (int q = 0; q < peers; ++q) {
    if (q == rank) continue;
    for (int64_t j = 0; j < local; ++j) {
      in_rows += static_cast<uint64_t>((((rank * local + j) * 7) + q) % 5);
    }
  }
  const uint64_t row_bytes = hidden * sizeof(float);
  const uint64_t counts_bytes = (peers - 1) * local * sizeof(int64_t);
  testing::reset_observed_traffic();
  const at::Tensor y = run_experts(rows, counts, shard, [](int64_t j, const at::Tensor& x) {
    return x * static_cast<double>(j + 2);
  });
  const testing::ObservedTraffic forward = testing::observed_traffic({mesh->group(expert_axis())});
  EXPECT_EQ(forward.kinds[KOLOS_PMPI_ALLTOALL].calls, 3u);  // counts, dispatch, combine
  EXPECT_EQ(forward.kinds[KOLOS_PMPI_ALLTOALL].sent_bytes,
            counts_bytes + (out_rows + in_rows) * row_bytes);
  EXPECT_EQ(forward.sent(), forward.kinds[KOLOS_PMPI_ALLTOALL].sent_bytes);
  testing::reset_observed_traffic();
  y.sum().backward();
  const testing::ObservedTraffic backward = testing::observed_traffic({mesh->group(expert_axis())});
  EXPECT_EQ(backward.kinds[KOLOS_PMPI_ALLTOALL].calls, 2u);
  EXPECT_EQ(backward.kinds[KOLOS_PMPI_ALLTOALL].sent_bytes, (out_rows + in_rows) * row_bytes);
}

TEST(MoeExpertParallel, EveryRankItsShareOfExpertsMatchesSerial) {
  REQUIRE_RANKS(2, 4);
  testing::expect_equivalent(serial(), parallel({dp_all(), ep(world_size())}));
}

TEST(MoeExpertParallel, SigmoidRouterWithSharedExpertsMatchesSerial) {
  REQUIRE_RANKS(2, 4);
  const std::vector<std::string> deepseek = {"model.router=\"sigmoid\"", "model.shared_experts=1"};
  std::vector<std::string> with_ep = deepseek;
  with_ep.insert(with_ep.end(), {dp_all(), ep(2)});
  testing::expect_equivalent(serial(deepseek), parallel(with_ep));
  std::vector<std::string> with_tp = deepseek;
  with_tp.insert(with_tp.end(),
                 {"parallel.tensor.size=2", "parallel.data=" + std::to_string(world_size() / 2)});
  testing::expect_equivalent(serial(deepseek), parallel(with_tp));
}

TEST(MoeExpertParallel, DataTimesExpertMatchesSerial) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), parallel({dp_all(), ep(2)}));
}

TEST(MoeExpertParallel, WithZeroStagesMatchesSerial) {
  // At 4 ranks (dp 2 x ep 2) the experts are sharded over dp, the rest over
  // dp x ep; at 2 ranks the experts' group has one rank.
  REQUIRE_RANKS(2, 4);
  for (const int stage : {1, 2, 3}) {
    SCOPED_TRACE("zero" + std::to_string(stage));
    testing::expect_equivalent(
        serial(), parallel({dp_all(), ep(2), "parallel.zero.stage=" + std::to_string(stage)}));
  }
}

TEST(MoeExpertParallel, WithTp1dMatchesSerial) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(),
                             parallel({"parallel.tensor.size=2", "parallel.data=2", ep(2)}));
}

TEST(MoeExpertParallel, WithPipelineMatchesSerial) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(),
                             parallel({"parallel.pipeline.size=2", "parallel.data=2", ep(2)}));
}

TEST(MoeExpertParallel, WithZero3AndRecomputationMatchesSerial) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), parallel({dp_all(), ep(2), "parallel.zero.stage=3",
                                                 "train.recompute=full"}));
}

TEST(MoeExpertParallel, RecomputedWithACapacityMatchesSerial) {
  REQUIRE_RANKS(2);
  testing::expect_equivalent(serial({"model.capacity_factor=0.5"}),
                             parallel({"model.capacity_factor=0.5", dp_all(), ep(2),
                                       "train.recompute=full"}));
}

TEST(MoeExpertParallel, EveryOtherBlockWithZLossMatchesSerial) {
  REQUIRE_RANKS(2);
  const std::vector<std::string> every = {"model.layers=4", "model.moe_every=2",
                                          "model.z_loss_coef=0.001"};
  std::vector<std::string> mix = every;
  mix.insert(mix.end(), {dp_all(), ep(2)});
  testing::expect_equivalent(serial(every), parallel(mix));
}

// A checkpoint saved under one ep size loads under another: the same global
// parameters, and the next step's loss is the same.
TEST(MoeExpertParallel, CheckpointSavedUnderEpLoadsUnderDpAndBack) {
  REQUIRE_RANKS(2, 4);
  expect_resumes_across({dp_all(), ep(world_size())}, {dp_all()}, "moe-ep-to-dp");
  expect_resumes_across({dp_all()}, {dp_all(), ep(2)}, "moe-dp-to-ep");
  expect_resumes_across({dp_all(), ep(2), "parallel.zero.stage=2"},
                        {dp_all(), "parallel.zero.stage=1"}, "moe-ep-zero2-to-zero1");
  expect_resumes_across({dp_all(), "parallel.zero.stage=3"},
                        {dp_all(), ep(world_size()), "parallel.zero.stage=3"}, "moe-zero3-to-ep");
}

TEST(MoeExpertParallel, EveryExpertIsDrawnAsSeriallyWhateverTheEpSize) {
  REQUIRE_RANKS(4);
  auto a = engine_for(parallel({dp_all()}));
  auto b = engine_for(parallel({dp_all(), ep(4)}));
  expect_same_parameters(*a, *b);
}

}  // namespace
}  // namespace kolos
