// DiT against the serial run of the same model on 2 ranks: the parallel
// plugins run it unchanged (patch projection, timestep MLP, class table,
// adaLN-Zero blocks and the final layer are built through the LayerFactory),
// and each sample's timestep, noise and class dropout are drawn from a key
// that is a function of (seed, global sample index), so every layout draws
// what the serial run draws. Synthetic labelled images (data.kind =
// "synthetic"), 8x8 pixels in 2 channels cut into 4 patches of 4x4, 5
// classes; tolerances are the harness's (testing::Tolerance).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/modules/data.h"
#include "kolos/modules/dit.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

const testing::TinyModel tiny_dit =
    testing::tiny_image_model("dit", "diffusion_steps = 100\nclass_dropout = 0.2\n",
                              {"optim.lr=1e-2", "optim.warmup_steps=2", "optim.min_lr=1e-3"});

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(DitConfig, DerivesItsSequenceAndReadsBack) {
  const RunConfig c = tiny_dit();
  EXPECT_EQ(c.model.seq_len, 8 * 8 * 2 + 2);  // pixels, label, noise key
  EXPECT_EQ(c.model.vocab, 5);
  EXPECT_EQ(c.model.diffusion_steps, 100);
  EXPECT_EQ(c.model.beta_schedule, "linear");
  EXPECT_EQ(c.model.pos_embed, "sincos");
  const RunConfig again = parse_run_config(to_toml(c), "<to_toml>");
  EXPECT_EQ(again.model.name, "dit");
  EXPECT_EQ(again.model.seq_len, c.model.seq_len);
  EXPECT_EQ(again.model.diffusion_steps, 100);
  EXPECT_DOUBLE_EQ(again.model.class_dropout, 0.2);
}

TEST(DitConfig, RefusesWhatDoesNotApply) {
  EXPECT_HAS(tiny_dit.config_error({"model.patch_size=3"}),
             "not divisible by model.patch_size = 3");
  EXPECT_HAS(tiny_dit.config_error({"model.seq_len=16"}), "does not apply to model.name = \"dit\"");
  EXPECT_HAS(tiny_dit.config_error({"model.vocab=16"}), "vocab");
  EXPECT_HAS(tiny_dit.config_error({"model.rope_theta=1.0"}), "llama");
  EXPECT_HAS(tiny_dit.config_error({"model.beta_schedule=\"quadratic\""}), "beta_schedule");
  EXPECT_HAS(tiny_dit.config_error({"model.class_dropout=1.0"}), "class_dropout");
  EXPECT_HAS(tiny_dit.config_error({"model.diffusion_steps=1"}), "diffusion_steps");
  EXPECT_HAS(tiny_dit.config_error({"model.pos_embed=\"rope\""}), "pos_embed");
  EXPECT_HAS(tiny_dit.config_error({"model.bogus=1"}), "bogus");
  EXPECT_HAS(tiny_dit.config_error({"data.kind=\"tokens\"", "data.path=\"x.bin\""}),
             "reads images");
  // Sequence parallelism: refused at config time, naming the key.
  const std::string sequence = tiny_dit.config_error({"parallel.sequence.size=2"});
  EXPECT_HAS(sequence, "parallel.sequence");
  EXPECT_HAS(sequence, "model.name = \"dit\"");
  // A GPT or a ViT refuses the DiT's own keys.
  for (const char* other : {"gpt", "vit"}) {
    try {
      parse_run_config(std::string("[model]\nname = \"") + other +
                           "\"\nimage_size = 8\npatch_size = 4\nchannels = 1\nclasses = 3\n"
                           "diffusion_steps = 10\n",
                       "<other>");
      ADD_FAILURE() << "model.diffusion_steps accepted for " << other;
    } catch (const ConfigError& e) {
      EXPECT_HAS(std::string(e.what()), "diffusion_steps");
    }
  }
}

TEST(DitData, KeysFollowTheSampleIndex) {
  const RunConfig c = tiny_dit();
  const auto source = data::make_source(c);
  ASSERT_EQ(source->seq_len(), c.model.seq_len);
  const int64_t n = c.model.seq_len + 1, pixels = 8 * 8 * 2;
  std::vector<int64_t> a(n), b(n), d(n);
  source->sample(3, a.data());
  source->sample(3, b.data());
  source->sample(4, d.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(a[pixels + 1], a[pixels + 2]);  // input's last value = targets' last value
  EXPECT_NE(a[pixels + 1], d[pixels + 1]);
  EXPECT_GE(a[pixels], 0);
  EXPECT_LT(a[pixels], 5);
  // Another seed, other keys.
  const auto other = data::make_source(tiny_dit({"train.seed=8"}));
  other->sample(3, b.data());
  EXPECT_NE(a[pixels + 1], b[pixels + 1]);
  // The draws from one key are the same whatever else is drawn with it.
  const modules::DitDraw one = modules::dit_draw(c.model, {a[pixels + 1]});
  const modules::DitDraw two = modules::dit_draw(c.model, {d[pixels + 1], a[pixels + 1]});
  EXPECT_EQ(one.timesteps[0], two.timesteps[1]);
  EXPECT_TRUE(torch::equal(one.noise[0], two.noise[1]));
}

TEST(DitSerial, Learns) {
  const testing::RunRecord r = testing::serial_record(tiny_dit.serial({"train.steps=40"}));
  ASSERT_EQ(r.losses.size(), 40u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += r.losses[i] / 5;
    last += r.losses[35 + i] / 5;
  }
  if (testing::world_rank() == 0) {
    std::printf("[dit] mean loss of steps 1-5 %.4f, of steps 36-40 %.4f\n", first, last);
  }
  EXPECT_LT(last, 0.8 * first);
}

class DitLayouts : public ::testing::TestWithParam<testing::Mix> {};
TEST_P(DitLayouts, MatchSerial) { testing::expect_mix_matches_serial(GetParam(), tiny_dit); }
INSTANTIATE_TEST_SUITE_P(TwoRanks, DitLayouts, ::testing::ValuesIn(testing::two_rank_mixes()),
                         testing::mix_name);
TEST(DitRecompute, FullMatchesSerial) {
  testing::expect_equivalent(tiny_dit.serial(),
                             tiny_dit({"parallel.data=2", "train.recompute=\"full\""}));
}
// The chunks memory plugin: every parameter, gradient and AdamW state in
// chunks of 32 KiB under a budget smaller than their sum, on host memory.
TEST(DitChunks, OnHostMatchesSerial) {
  testing::expect_equivalent(tiny_dit.serial(),
                             tiny_dit({"parallel.data=2", "memory.compute_budget=\"384KiB\"",
                                       "memory.offload=\"host\"", "memory.chunk_size=\"32KiB\""}));
}
TEST(DitLearnedPositions, DataParallelMatchesSerial) {
  testing::expect_equivalent(
      tiny_dit.serial({"model.pos_embed=\"learned\"", "model.beta_schedule=\"cosine\""}),
      tiny_dit(
          {"parallel.data=2", "model.pos_embed=\"learned\"", "model.beta_schedule=\"cosine\""}));
}

// bf16 against fp32. Both runs draw the same timesteps, noise and class
// dropout (keyed by sample), so what differs is rounding: bf16 keeps 8
// bits of mantissa (2^-9 relative per rounding), about ten roundings lie in
// series in a forward (embedding, two blocks of norm, attention and MLP,
// the final layer), so the prediction moves by up to ~2% of its size and
// the mean squared error against the same noise by less. Bound: the mean
// loss of the last 5 of 40 steps within 5% of fp32's.
TEST(DitBf16, TrainsLikeFp32) {
  modules::register_builtin_models();
  const std::vector<std::string> base = {"parallel.data=2", "train.steps=40"};
  std::vector<std::string> low = base;
  low.push_back("train.precision=\"bf16\"");
  const testing::RunRecord a = testing::run_and_record(tiny_dit(base), testing::world_group());
  const testing::RunRecord b = testing::run_and_record(tiny_dit(low), testing::world_group());
  ASSERT_EQ(a.losses.size(), 40u);
  ASSERT_EQ(b.losses.size(), 40u);
  double fp32 = 0, bf16 = 0;
  for (size_t i = 35; i < 40; ++i) {
    fp32 += a.losses[i] / 5;
    bf16 += b.losses[i] / 5;
  }
  EXPECT_NE(a.losses[5], b.losses[5]);  // bf16 did run
  EXPECT_LT(fp32, 0.8 * a.losses[0]);
  EXPECT_NEAR(bf16, fp32, 0.05 * fp32);
  if (testing::world_rank() == 0) {
    std::printf("[dit bf16] mean loss of steps 36-40: fp32 %.6f bf16 %.6f\n", fp32, bf16);
  }
}

// The tensor-parallel grids (2d at 4 ranks, 2.5d and 3d at 8; ctest runs
// only *Grid* there): the patch, timestep and adaLN projections run whole on
// every rank, the conditioning token leaves the grid's layout for them
// (to_whole) and their shifts, scales and gates enter it (to_local); the
// affine-free norms reduce their statistics over the ranks that cut the
// features.
TEST(DitGrid, MatchesSerial) {
  const auto grids = testing::grid_layouts();
  if (grids.empty()) GTEST_SKIP() << "runs at 4 (2d) and 8 ranks (2.5d, 3d)";
  for (const auto& grid : grids) {
    SCOPED_TRACE(grid[1]);
    testing::expect_equivalent(tiny_dit.serial(), tiny_dit(grid));
  }
}

// ---- [eval]: the diffusion loss on held-out samples, no accuracy ---------

EvalResult train_and_evaluate(const RunConfig& config, const comm::ProcessGroupPtr& group) {
  modules::register_builtin_models();
  Engine engine(config, group, [](const RunConfig& c) { return data::make_source(c); });
  engine.train();
  return engine.evaluate();
}

TEST(DitEval, DataParallelMatchesSerialWithoutAccuracy) {
  const std::vector<std::string> ev = {"eval.samples=21", "train.steps=4", "train.micro_batch=2",
                                       "train.global_batch=8"};
  std::vector<std::string> dp = ev;
  dp.push_back("parallel.data=2");
  const EvalResult s = train_and_evaluate(tiny_dit.serial(ev), testing::self_group());
  const EvalResult p = train_and_evaluate(tiny_dit(dp), testing::world_group());
  EXPECT_EQ(s.samples, 21);
  EXPECT_GT(s.loss, 0.0);
  EXPECT_NEAR(p.loss, s.loss, 1e-5 * s.loss);
  EXPECT_LT(s.accuracy, 0.0);  // not a classifier
  EXPECT_LT(p.accuracy, 0.0);
}

// ---- the reverse process ----------------------------------------------------

TEST(DitSample, DrawsImagesOfTheModelsShape) {
  modules::register_builtin_models();
  const RunConfig c = tiny_dit();
  auto factory = make_serial_layer_factory();
  torch::manual_seed(1);
  std::shared_ptr<Model> model = build_model(c.model, *factory);
  modules::DitSampling s;
  s.steps = 5;
  s.cfg_scale = 2.0;
  s.seed = 3;
  const at::Tensor a = modules::dit_sample(*model, c.model, {0, 4, 2}, s);
  EXPECT_EQ(a.sizes(), at::IntArrayRef({3, 8, 8, 2}));
  EXPECT_TRUE(torch::isfinite(a).all().item<bool>());
  // Deterministic in the seed (DDIM); DDPM draws from it too.
  EXPECT_TRUE(torch::equal(a, modules::dit_sample(*model, c.model, {0, 4, 2}, s)));
  s.sampler = "ddpm";
  EXPECT_TRUE(torch::isfinite(modules::dit_sample(*model, c.model, {1}, s)).all().item<bool>());

  auto refusal = [&](const std::vector<int64_t>& labels, const modules::DitSampling& bad,
                     const ModelConfig& mc) -> std::string {
    try {
      modules::dit_sample(*model, mc, labels, bad);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  modules::DitSampling bad = s;
  EXPECT_HAS(refusal({5}, bad, c.model), "class 5 is outside the model's classes 0..4");
  bad.steps = 0;
  EXPECT_HAS(refusal({1}, bad, c.model), "steps = 0");
  bad = s;
  bad.sampler = "euler";
  EXPECT_HAS(refusal({1}, bad, c.model), "sampler `euler`");
  ModelConfig no_dropout = c.model;
  no_dropout.class_dropout = 0;
  EXPECT_HAS(refusal({1}, s, no_dropout), "class_dropout = 0");
}

}  // namespace
}  // namespace kolos
