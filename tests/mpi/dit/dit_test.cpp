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

RunConfig tiny_dit(const std::vector<std::string>& overrides = {}) {
  static const char* kText = R"(
[model]
name = "dit"
layers = 2
hidden = 32
heads = 4
image_size = 8
patch_size = 4
channels = 2
classes = 5
diffusion_steps = 100
class_dropout = 0.2

[data]
kind = "synthetic"

[optim]
lr = 1e-2
warmup_steps = 2
min_lr = 1e-3
weight_decay = 0.01
grad_clip = 1.0

[train]
global_batch = 16
micro_batch = 4
steps = 12
seed = 7

[log]
progress = "off"
)";
  return parse_run_config(kText, "<tiny-dit>", overrides);
}

RunConfig serial(std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.data=1");
  return tiny_dit(overrides);
}

std::string config_error(const std::vector<std::string>& overrides) {
  try {
    tiny_dit(overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

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
  EXPECT_HAS(config_error({"model.patch_size=3"}), "not divisible by model.patch_size = 3");
  EXPECT_HAS(config_error({"model.seq_len=16"}), "does not apply to model.name = \"dit\"");
  EXPECT_HAS(config_error({"model.vocab=16"}), "vocab");
  EXPECT_HAS(config_error({"model.rope_theta=1.0"}), "llama");
  EXPECT_HAS(config_error({"model.beta_schedule=\"quadratic\""}), "beta_schedule");
  EXPECT_HAS(config_error({"model.class_dropout=1.0"}), "class_dropout");
  EXPECT_HAS(config_error({"model.diffusion_steps=1"}), "diffusion_steps");
  EXPECT_HAS(config_error({"model.pos_embed=\"rope\""}), "pos_embed");
  EXPECT_HAS(config_error({"model.bogus=1"}), "bogus");
  EXPECT_HAS(config_error({"data.kind=\"tokens\"", "data.path=\"x.bin\""}), "reads images");
  // Sequence parallelism: refused at config time, naming the key.
  const std::string sequence = config_error({"parallel.sequence.size=2"});
  EXPECT_HAS(sequence, "parallel.sequence");
  EXPECT_HAS(sequence, "model.name = \"dit\"");
  // The 2d/2.5d/3d grids have no layout for its replicated projections.
  const std::string grid =
      config_error({"parallel.tensor.size=4", "parallel.tensor.mode=\"2d\""});
  EXPECT_HAS(grid, "parallel.tensor.mode = \"2d\": model.name = \"dit\"");
  EXPECT_HAS(grid, "set parallel.tensor.mode = \"1d\"");
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
  const testing::RunRecord r =
      testing::run_and_record(serial({"train.steps=40"}), testing::self_group());
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

TEST(DitDataParallel, MatchesSerial) {
  testing::expect_equivalent(serial(), tiny_dit({"parallel.data=2"}));
}
TEST(DitZero, Stage1MatchesSerial) {
  testing::expect_equivalent(serial(), tiny_dit({"parallel.zero.stage=1"}));
}
TEST(DitZero, Stage2MatchesSerial) {
  testing::expect_equivalent(serial(), tiny_dit({"parallel.zero.stage=2"}));
}
TEST(DitZero, Stage3MatchesSerial) {
  testing::expect_equivalent(serial(), tiny_dit({"parallel.zero.stage=3"}));
}
TEST(DitTp1d, MatchesSerial) {
  testing::expect_equivalent(serial(), tiny_dit({"parallel.tensor.size=2"}));
}
TEST(DitPipeline, OneFOneBMatchesSerial) {
  const std::vector<std::string> shape = {"train.micro_batch=2"};
  std::vector<std::string> mix = shape;
  mix.insert(mix.end(), {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""});
  testing::expect_equivalent(serial(shape), tiny_dit(mix));
}
TEST(DitRecompute, FullMatchesSerial) {
  testing::expect_equivalent(serial(), tiny_dit({"parallel.data=2", "train.recompute=\"full\""}));
}
TEST(DitLearnedPositions, DataParallelMatchesSerial) {
  testing::expect_equivalent(serial({"model.pos_embed=\"learned\"", "model.beta_schedule=\"cosine\""}),
                             tiny_dit({"parallel.data=2", "model.pos_embed=\"learned\"",
                                       "model.beta_schedule=\"cosine\""}));
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
  const EvalResult s = train_and_evaluate(serial(ev), testing::self_group());
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
