// Mixture of experts (model.name = "mixtral"; modules/src/llama/llama.cpp).
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
// - Bad input: each key named.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "equivalence.h"
#include "observed_traffic.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/aux_loss.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/experts.h"
#include "kolos/core/mesh.h"
#include "kolos/core/model.h"
#include "kolos/core/training_state.h"
#include "kolos/inference/engine.h"
#include "kolos/inference/scheduler.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"
#include "kolos/modules/hf.h"

namespace kolos {
namespace {

using testing::config_error;
using testing::world_size;

#define REQUIRE_RANKS(...)                                                        \
  do {                                                                            \
    const std::vector<int> allowed{__VA_ARGS__};                                  \
    if (std::find(allowed.begin(), allowed.end(), world_size()) == allowed.end()) \
      GTEST_SKIP() << "runs at " #__VA_ARGS__ " ranks";                           \
  } while (0)

void expect_has(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in: " << message;
}

// hidden 32, 4 heads, 4 experts of SwiGLU width 96, top 2.
std::vector<std::string> mixtral(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(),
                   {"model.name=mixtral", "model.vocab=65", "model.experts=4", "model.top_k=2",
                    "model.aux_loss_coef=0.05", "optim.grad_clip=0.05"});
  return overrides;
}
RunConfig serial(std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.data=1");
  return testing::tiny_gpt_config(mixtral(std::move(overrides)));
}
RunConfig parallel(std::vector<std::string> overrides) {
  return testing::tiny_gpt_config(mixtral(std::move(overrides)));
}
std::string dp_all() { return "parallel.data=" + std::to_string(world_size()); }

// ---- the layer ----------------------------------------------------------------

struct Built {
  std::shared_ptr<Model> model;
  std::shared_ptr<LayerFactory> factory;
};
Built build(const RunConfig& c) {
  modules::register_builtin_models();
  Built b;
  b.factory = make_serial_layer_factory();
  torch::manual_seed(3);
  b.model = build_model(c.model, *b.factory);
  return b;
}

torch::nn::Module& child(torch::nn::Module& m, const std::string& path) {
  torch::nn::Module* at = &m;
  size_t start = 0;
  while (start < path.size()) {
    const size_t dot = path.find('.', start);
    const std::string name = path.substr(start, dot == std::string::npos ? dot : dot - start);
    at = at->named_children()[name].get();
    start = dot == std::string::npos ? path.size() : dot + 1;
  }
  return *at;
}

// The MoE MLP of block 0 and its pieces, run on x [N, H].
struct Moe {
  Layer* layer;
  at::Tensor router;                   // [E, H]
  std::vector<Layer*> experts;
};
Moe moe_of(Model& model, int64_t experts) {
  Moe m;
  auto& block = *model.blocks()[1].second;  // h.0
  m.layer = dynamic_cast<Layer*>(&child(block, "mlp"));
  m.router = child(block, "mlp.router").named_parameters()["weight"];
  for (int64_t e = 0; e < experts; ++e) {
    m.experts.push_back(dynamic_cast<Layer*>(&child(block, "mlp.experts." + std::to_string(e))));
  }
  return m;
}

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

std::string ep(int64_t size) { return "parallel.expert.size=" + std::to_string(size); }

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
std::unique_ptr<Engine> engine_for(const RunConfig& c) {
  modules::register_builtin_models();
  return std::make_unique<Engine>(c, testing::world_group(),
                                  [](const RunConfig& r) { return data::make_source(r); });
}

void expect_same_parameters(Engine& a, Engine& b) {
  const auto pa = a.gathered_parameters(), pb = b.gathered_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
}

void expect_resumes_across(const std::vector<std::string>& saved_mix,
                           const std::vector<std::string>& loaded_mix, const std::string& tag) {
  auto a = engine_for(parallel(saved_mix));
  for (int s = 0; s < 3; ++s) a->step();
  const std::string root = testing::shared_tmpdir(tag);
  checkpoint::Checkpointer ckpt(testing::world_group(), {root, 0, false});
  ckpt.save(a->state());
  auto b = engine_for(parallel(loaded_mix));
  checkpoint::Checkpointer reader(testing::world_group(), {root, 0, false});
  TrainingState state = b->state();
  reader.load(root, state);
  b->load_state(state);
  expect_same_parameters(*a, *b);
  const double la = a->step().loss, lb = b->step().loss;
  EXPECT_NEAR(la, lb, 1e-5 * std::abs(la));
}

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

// ---- served by the inference engine -----------------------------------------------

// The greedy continuation by the model's own full forward (no cache).
std::vector<int64_t> greedy_full_forward(Model& model, std::vector<int64_t> ids, int64_t n) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor logits = model.forward(torch::tensor(ids, torch::kInt64).unsqueeze(0));
    out.push_back(logits[0][-1].argmax().item<int64_t>());
    ids.push_back(out.back());
  }
  return out;
}

// A mixtral trained with auxiliary-loss-free balancing is served (the
// engine of kolos generate and serve, from its checkpoint, with a paged KV
// cache) with the greedy tokens of the trained model's own forward: the
// balancing bias, checkpointed as run state, chooses the experts there too.
// Without the bias the tokens differ (checked, so that the test can tell).
TEST(MoeInference, ServesTheTrainedModelsGreedyTokensWithItsBalancingBias) {
  REQUIRE_RANKS(1);
  auto trained = engine_for(serial({"model.bias_update_rate=0.2", "model.init_std=0.3",
                                    "optim.lr=0.03"}));
  for (int s = 0; s < 3; ++s) trained->step();
  const std::string root = testing::shared_tmpdir("moe-serve");
  checkpoint::Checkpointer(testing::world_group(), {root, 0, false}).save(trained->state());
  const std::vector<int64_t> prompt = {5, 17, 42, 3};
  const int64_t n = 10;  // 4 + 10 tokens within the model's 16 positions
  inference::InferenceEngine served(root, inference::InferenceConfig{}, testing::world_group());
  inference::Request request;
  request.prompt = prompt;
  request.sampling.max_tokens = n;
  served.scheduler().add_request(request);
  std::vector<int64_t> tokens;
  served.run([&](const inference::TokenEvent& e) { tokens.push_back(e.token); });
  const std::vector<int64_t> expected = greedy_full_forward(trained->model(), prompt, n);
  EXPECT_EQ(tokens, expected);
  const auto biases = router_biases(trained->model());
  ASSERT_FALSE(biases.empty());
  for (const auto& [name, bias] : biases) {
    EXPECT_GT(bias.abs().max().item<double>(), 0.0) << name << " did not move";
    bias.zero_();
  }
  EXPECT_NE(greedy_full_forward(trained->model(), prompt, n), expected)
      << "the balancing bias changes no token here: the check above cannot tell it was loaded";
}

// ---- routing metrics ------------------------------------------------------------

std::vector<StepMetrics> steps_of(const RunConfig& c, const comm::ProcessGroupPtr& group,
                                  int steps) {
  modules::register_builtin_models();
  Engine engine(c, group, [](const RunConfig& r) { return data::make_source(r); });
  std::vector<StepMetrics> out;
  for (int s = 0; s < steps; ++s) out.push_back(engine.step());
  return out;
}

void expect_same_routing(const std::vector<StepMetrics>& a, const std::vector<StepMetrics>& b,
                         const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) {
    SCOPED_TRACE(what + ", step " + std::to_string(s + 1));
    EXPECT_EQ(a[s].moe_blocks, b[s].moe_blocks);
    EXPECT_EQ(a[s].expert_tokens_min, b[s].expert_tokens_min);
    EXPECT_EQ(a[s].expert_tokens_max, b[s].expert_tokens_max);
    EXPECT_NEAR(a[s].expert_cv, b[s].expert_cv, 1e-9);
    EXPECT_EQ(a[s].tokens_dropped, b[s].tokens_dropped);
    EXPECT_NEAR(a[s].aux_loss, b[s].aux_loss, 1e-5 * std::abs(a[s].aux_loss));
  }
}

TEST(MoeRouting, TheStepsRoutingIsTheSerialRunsUnderEveryLayout) {
  REQUIRE_RANKS(2, 4);
  const std::vector<std::string> cap = {"model.capacity_factor=1.0"};
  const auto reference = steps_of(serial(cap), testing::self_group(), 3);
  ASSERT_EQ(reference[0].moe_blocks, 2);
  EXPECT_GT(reference[0].tokens_dropped, 0);
  EXPECT_GT(reference[0].aux_loss, 0.0);
  EXPECT_LT(reference[0].expert_tokens_min, reference[0].expert_tokens_max);
  for (const auto& mix : std::vector<std::vector<std::string>>{
           {dp_all()},
           {dp_all(), ep(world_size())},
           {"parallel.tensor.size=2", "parallel.data=" + std::to_string(world_size() / 2)},
           {"parallel.pipeline.size=2", "parallel.data=" + std::to_string(world_size() / 2)},
           {dp_all(), "train.recompute=full"}}) {
    std::vector<std::string> with = cap;
    with.insert(with.end(), mix.begin(), mix.end());
    expect_same_routing(reference, steps_of(parallel(with), testing::world_group(), 3),
                        with.back());
  }
}

TEST(MoeRouting, ACapacityBoundsEveryExpertAndTopKAllIsBalanced) {
  REQUIRE_RANKS(1);
  // top_k = experts: every expert takes every token of the step.
  const RunConfig all = serial({"model.top_k=4"});
  const int64_t tokens = all.train.global_batch * all.model.seq_len;
  for (const StepMetrics& m : steps_of(all, testing::self_group(), 2)) {
    EXPECT_EQ(m.expert_tokens_min, tokens);
    EXPECT_EQ(m.expert_tokens_max, tokens);
    EXPECT_EQ(m.expert_cv, 0.0);
    EXPECT_EQ(m.tokens_dropped, 0);
  }
  // Capacity 0.5: no expert takes more than its capacity per micro-batch.
  const RunConfig capped = serial({"model.capacity_factor=0.5"});
  const int64_t micro = capped.train.global_batch / capped.train.micro_batch;
  const int64_t per_micro = capped.train.micro_batch * capped.model.seq_len;
  const int64_t capacity = (per_micro * 2 + 2 * 4 - 1) / (2 * 4);  // ceil(0.5 x N x 2 / 4)
  for (const StepMetrics& m : steps_of(capped, testing::self_group(), 2)) {
    EXPECT_LE(m.expert_tokens_max, micro * capacity);
    EXPECT_GT(m.tokens_dropped, 0);
  }
}

const std::string kBias = "model.bias_update_rate=0.01";

// ---- the chunks memory plugin ---------------------------------------------------

// Parameters, gradients and AdamW states (28 chunks of 16 KiB per kind)
// under a 768 KiB budget, moved to and from host memory as the blocks run.
TEST(MoeChunks, OnHostMatchesSerial) {
  REQUIRE_RANKS(1, 2);
  const std::vector<std::string> on_host = {kBias, dp_all(), "memory.compute_budget=\"768KiB\"",
                                            "memory.offload=\"host\"",
                                            "memory.chunk_size=\"16KiB\""};
  for (const auto& placement : std::vector<std::vector<std::string>>{
           {"memory.placement=\"auto\""},
           {"memory.placement=\"static\"", "memory.param_fraction=0.3"}}) {
    SCOPED_TRACE(placement[0]);
    std::vector<std::string> o = on_host;
    o.insert(o.end(), placement.begin(), placement.end());
    testing::expect_equivalent(serial({kBias}), parallel(o));
  }
}

// Under expert parallelism the experts' chunks are reduced (and under ZeRO
// owned) over dp x sp and divided by the ep size, the rest over dp x ep x
// sp; experts never share a chunk with dense weights. At 2 ranks (ep 2)
// the experts' group is one rank (the division alone), under no ZeRO and
// ZeRO-2; at 4 (dp 2 x ep 2) it is two, under ZeRO-3 (reduced to their
// owners and gathered), and a checkpoint saved under ZeRO-1 (each
// optimizer chunk from its owner) loads under dp alone, without chunks.
TEST(MoeChunks, UnderExpertParallelismMatchesSerialAndResumesUnderDp) {
  REQUIRE_RANKS(2, 4);
  const std::vector<std::string> chunks = {"memory.compute_budget=\"768KiB\"",
                                           "memory.chunk_size=\"16KiB\""};
  for (const int stage : world_size() == 2 ? std::vector<int>{0, 2} : std::vector<int>{3}) {
    SCOPED_TRACE("zero" + std::to_string(stage));
    std::vector<std::string> o = {kBias, dp_all(), ep(2),
                                  "parallel.zero.stage=" + std::to_string(stage)};
    o.insert(o.end(), chunks.begin(), chunks.end());
    testing::expect_equivalent(serial({kBias}), parallel(o));
  }
  if (world_size() != 4) return;
  std::vector<std::string> saved = {dp_all(), ep(2), "parallel.zero.stage=1"};
  saved.insert(saved.end(), chunks.begin(), chunks.end());
  expect_resumes_across(saved, {dp_all()}, "moe-chunks-ep-to-dp");
}

// ---- auxiliary-loss-free balancing ---------------------------------------------

TEST(MoeBalancingBias, ChoosesTheExpertsButNotTheirWeights) {
  REQUIRE_RANKS(1);
  const RunConfig c = serial({kBias});
  Built b = build(c);
  Moe m = moe_of(*b.model, 4);
  const auto biases = router_biases(*b.model);
  ASSERT_EQ(biases.size(), 2u);
  EXPECT_EQ(biases[0].first, "h.0.mlp.router_bias");
  EXPECT_EQ(biases[1].first, "h.1.mlp.router_bias");
  EXPECT_TRUE(torch::equal(biases[0].second, torch::zeros({4})));
  torch::NoGradGuard no_grad;
  // Expert 3 is every token's choice; its weight is still its own score.
  biases[0].second.copy_(torch::tensor({0.0f, 0.0f, 0.0f, 10.0f}));
  const at::Tensor x = torch::randn({3, 4, 32});
  const at::Tensor flat = x.reshape({-1, 32});
  const at::Tensor probs = torch::softmax(torch::matmul(flat, m.router.t()), -1);
  at::Tensor expected = torch::zeros_like(flat);
  int64_t unbiased_choice_differs = 0;
  for (int64_t t = 0; t < flat.size(0); ++t) {
    const int64_t other = probs[t].narrow(0, 0, 3).argmax().item<int64_t>();
    const at::Tensor w = torch::stack({probs[t][3], probs[t][other]});
    const at::Tensor row = flat[t].unsqueeze(0);
    expected[t] = m.experts[3]->forward(row)[0] * (w[0] / w.sum()) +
                  m.experts[other]->forward(row)[0] * (w[1] / w.sum());
    if (!std::get<1>(probs[t].topk(2)).eq(3).any().item<bool>()) ++unbiased_choice_differs;
  }
  EXPECT_GT(unbiased_choice_differs, 0) << "the bias changed no token's choice";
  const at::Tensor out = m.layer->forward(x).reshape({-1, 32});
  EXPECT_TRUE(torch::allclose(out, expected, 1e-5, 1e-6))
      << (out - expected).abs().max().item<double>();
}

std::vector<at::Tensor> biases_of(Engine& e) {
  std::vector<at::Tensor> out;
  for (const auto& [name, bias] : router_biases(e.model())) out.push_back(bias.clone());
  return out;
}

TEST(MoeBalancingBias, MovesTowardsBalanceAfterEveryStep) {
  REQUIRE_RANKS(1);
  const double rate = 0.01;
  // top_k = experts: every expert takes every token, so no bias moves.
  auto all = engine_for(serial({kBias, "model.top_k=4"}));
  all->step();
  for (const at::Tensor& b : biases_of(*all)) EXPECT_TRUE(torch::equal(b, torch::zeros({4})));
  // top 2: after one step each bias is +-rate (or 0 at the mean): up for the
  // experts that took fewer than the mean, down for the others.
  auto two = engine_for(serial({kBias}));
  two->step();
  for (const at::Tensor& b : biases_of(*two)) {
    EXPECT_TRUE((b.abs().lt(1e-9) | b.abs().sub(rate).abs().lt(1e-9)).all().item<bool>()) << b;
    EXPECT_GT(b.max().item<double>(), 0);
    EXPECT_LT(b.min().item<double>(), 0);
  }
  // An expert every token is made to choose is above the mean: it loses
  // rate; some other expert is below it and gains rate.
  auto forced = engine_for(serial({kBias}));
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, bias] : router_biases(forced->model())) bias[3].fill_(10.0);
  }
  forced->step();
  for (const at::Tensor& b : biases_of(*forced)) {
    EXPECT_NEAR(b[3].item<double>(), 10.0 - rate, 1e-6) << b;
    EXPECT_NEAR(b.narrow(0, 0, 3).max().item<double>(), rate, 1e-9) << b;
  }
  // Without the load-balancing loss, the bias evens the load out over the
  // steps after the first (the mean imbalance is lower than with no bias).
  const auto mean_cv = [](const std::vector<StepMetrics>& steps) {
    double sum = 0;
    for (size_t s = 1; s < steps.size(); ++s) sum += steps[s].expert_cv;
    return sum / static_cast<double>(steps.size() - 1);
  };
  const double balanced = mean_cv(steps_of(
      serial({"model.aux_loss_coef=0.0", "model.bias_update_rate=0.0005"}), testing::self_group(), 10));
  const double plain =
      mean_cv(steps_of(serial({"model.aux_loss_coef=0.0"}), testing::self_group(), 10));
  EXPECT_LT(balanced, plain);
  std::printf("mean expert cv over steps 2-10: %.4f with the bias, %.4f without\n", balanced, plain);
}

TEST(MoeBalancingBias, EveryLayoutMatchesSerial) {
  REQUIRE_RANKS(2, 4);
  // Expert parallelism at 2 ranks (every rank its share), tp and the
  // pipeline at 4 (x dp 2): the biases move by counts summed over them all.
  const std::vector<std::vector<std::string>> mixes =
      world_size() == 2
          ? std::vector<std::vector<std::string>>{{dp_all(), ep(2)},
                                                  {dp_all(), ep(2), "parallel.zero.stage=3"}}
          : std::vector<std::vector<std::string>>{{"parallel.tensor.size=2", "parallel.data=2"},
                                                  {"parallel.pipeline.size=2", "parallel.data=2"}};
  for (const auto& mix : mixes) {
    SCOPED_TRACE(mix.back());
    std::vector<std::string> with = {kBias};
    with.insert(with.end(), mix.begin(), mix.end());
    testing::expect_equivalent(serial({kBias}), parallel(with));
  }
}

// The biases are checkpointed (state/h.N.mlp.router_bias) and resume under
// another layout; a checkpoint without them loads into a run that keeps
// them (they start at 0), and one with them into a run that does not.
TEST(MoeBalancingBias, CheckpointedAndResumedUnderAnotherLayout) {
  REQUIRE_RANKS(2, 4);
  auto a = engine_for(parallel({kBias, dp_all(), ep(2)}));
  for (int s = 0; s < 3; ++s) a->step();
  const std::string root = testing::shared_tmpdir("moe-bias");
  checkpoint::Checkpointer ckpt(testing::world_group(), {root, 0, false});
  ckpt.save(a->state());
  auto b = engine_for(parallel({kBias, dp_all()}));
  checkpoint::Checkpointer reader(testing::world_group(), {root, 0, false});
  TrainingState state = b->state();
  reader.load(root, state);
  b->load_state(state);
  const auto ba = biases_of(*a), bb = biases_of(*b);
  ASSERT_EQ(ba.size(), bb.size());
  for (size_t i = 0; i < ba.size(); ++i) {
    EXPECT_GT(ba[i].abs().max().item<double>(), 0);
    EXPECT_TRUE(torch::equal(ba[i], bb[i]));
  }
  expect_same_parameters(*a, *b);
  // Without the biases in the run: the checkpoint's are not read.
  auto plain = engine_for(parallel({dp_all()}));
  TrainingState plain_state = plain->state();
  checkpoint::Checkpointer(testing::world_group(), {root, 0, false}).load(root, plain_state);
  plain->load_state(plain_state);
  expect_same_parameters(*plain, *b);
  EXPECT_TRUE(biases_of(*plain).empty());

  const double la = a->step().loss, lb = b->step().loss;
  EXPECT_NEAR(la, lb, 1e-5 * std::abs(la));
  EXPECT_TRUE(torch::equal(biases_of(*a)[0], biases_of(*b)[0]));
  // A checkpoint without biases into a run with them: they stay 0.
  const std::string root2 = testing::shared_tmpdir("moe-no-bias");
  checkpoint::Checkpointer(testing::world_group(), {root2, 0, false}).save(plain->state());
  auto c = engine_for(parallel({kBias, dp_all(), ep(2)}));
  TrainingState c_state = c->state();
  checkpoint::Checkpointer(testing::world_group(), {root2, 0, false}).load(root2, c_state);
  c->load_state(c_state);
  for (const at::Tensor& bias : biases_of(*c)) EXPECT_TRUE(torch::equal(bias, torch::zeros({4})));
  expect_same_parameters(*plain, *c);
}

// ---- bad input ----------------------------------------------------------------

TEST(MoeBadInput, KeysNamed) {
  REQUIRE_RANKS(1);
  EXPECT_EQ(config_error(mixtral({})), "");
  expect_has(config_error(mixtral({"model.top_k=5"})),
             "model.top_k = 5 is more than model.experts = 4");
  expect_has(config_error(mixtral({"model.experts=1", "model.top_k=1"})),
             "a mixture needs at least 2 experts");
  EXPECT_EQ(config_error(mixtral({"model.capacity_factor=0.0"})), "");  // dropless
  expect_has(config_error(mixtral({"model.capacity_factor=-1.0"})), "model.capacity_factor");
  expect_has(config_error(mixtral({"model.moe_every=3"})), "model.moe_every = 3 is more than");
  expect_has(config_error(mixtral({"model.aux_loss_coef=-0.1"})), "model.aux_loss_coef");
  expect_has(config_error(mixtral({"model.mlp_ratio=4"})), "model.mlp_ratio");
  // The experts' keys on another model.
  const std::string m = config_error({"model.experts=4"});
  expect_has(m, "model.experts");
  expect_has(m, "applies to model.name = \"mixtral\" only, not to model.name = \"gpt\"");
  expect_has(config_error({"model.name=llama", "model.top_k=2"}),
             "applies to model.name = \"mixtral\" only, not to model.name = \"llama\"");
}

TEST(MoeBadInput, LayoutsNotCoveredAreRefused) {
  REQUIRE_RANKS(1);
  expect_has(config_error(mixtral({"parallel.sequence.size=2"})),
             "does not run under sequence parallelism yet");
  expect_has(config_error(mixtral({"parallel.tensor.size=4", "parallel.tensor.mode=2d"})),
             "runs under tensor mode \"1d\" only");
  expect_has(config_error(mixtral({"parallel.auto=true"})),
             "the planner does not model mixture-of-experts layers");
}

// What MixtralForCausalLM cannot express is refused by --format hf export,
// naming the key.
TEST(MoeBadInput, HfExportRefusesWhatMixtralCannotHold) {
  REQUIRE_RANKS(1);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.router=\"sigmoid\"", "model.router = \"sigmoid\""},
      {"model.shared_experts=1", "model.shared_experts = 1"},
      {"model.capacity_factor=1.0", "model.capacity_factor"},
      {"model.moe_every=2", "model.moe_every = 2"},
      {"model.bias_update_rate=0.001", "model.bias_update_rate = 0.001"}};
  for (const auto& [override_, message] : cases) {
    const RunConfig c = serial({override_});
    try {
      modules::llama_to_hf_llama(c.model, {});
      ADD_FAILURE() << override_ << " was exported";
    } catch (const ConfigError& e) {
      expect_has(e.what(), message);
    }
  }
}

TEST(MoeBadInput, ExpertAxisKeysNamed) {
  REQUIRE_RANKS(1);
  EXPECT_EQ(config_error(mixtral({ep(2)})), "");
  EXPECT_EQ(config_error(mixtral({ep(2), "parallel.data=4"})), "");  // dp 2 x ep 2
  expect_has(config_error({ep(2)}), "parallel.expert.size = 2: model.name = \"gpt\" has no experts");
  expect_has(config_error(mixtral({ep(3), "parallel.data=3"})),
             "parallel.expert.size = 3 does not divide model.experts = 4");
  expect_has(config_error(mixtral({ep(2), "parallel.data=3"})),
             "parallel.expert.size = 2 does not divide the 3 data ranks");
  EXPECT_EQ(config_error(mixtral({ep(2), "parallel.zero.stage=3"})), "");
  expect_has(config_error(mixtral({"parallel.expert.size=0"})), "parallel.expert.size");
  expect_has(config_error(mixtral({"parallel.expert.ranks=2"})),
             "unknown key `parallel.expert.ranks`");
  expect_has(config_error(mixtral({"model.router=\"tanh\""})), "model.router");
  expect_has(config_error(mixtral({"model.shared_experts=-1"})), "model.shared_experts");
  expect_has(config_error({"model.name=llama", "model.shared_experts=1"}),
             "applies to model.name = \"mixtral\" only");
  expect_has(config_error(mixtral({"model.bias_update_rate=-0.1"})), "model.bias_update_rate");
  expect_has(config_error({"model.bias_update_rate=0.001"}),
             "applies to model.name = \"mixtral\" only");
}

}  // namespace
}  // namespace kolos
