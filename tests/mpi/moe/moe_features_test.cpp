// Mixture of experts (model.name = "mixtral") beyond the layer and its
// equivalence with the serial run (moe_test.cpp; shared helpers in
// moe_test_util.h):
// - Served by the inference engine from its checkpoint, with the balancing
//   bias, as the trained model's own greedy forward.
// - The routing metrics of a step equal the serial run's under every
//   layout; a capacity bounds every expert, top_k = experts balances.
// - The chunks memory plugin: on host, and under expert parallelism with
//   ZeRO, equal to the serial run; a checkpoint resumes under dp.
// - Auxiliary-loss-free balancing (model.bias_update_rate): the bias
//   chooses the experts but not their weights, moves towards balance after
//   every step, equals the serial run under every layout, and is
//   checkpointed and resumed under another layout.
// - Bad input: each key named.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "equivalence.h"
#include "moe_test_util.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/experts.h"
#include "kolos/core/model.h"
#include "kolos/core/training_state.h"
#include "kolos/inference/engine.h"
#include "kolos/inference/scheduler.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"
#include "kolos/modules/hf.h"

namespace kolos {
namespace {

using namespace moe_test;
using testing::config_error;
using testing::world_size;

void expect_has(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in: " << message;
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
