// ViT against the serial run of the same model on 2 ranks: the parallel
// plugins run it unchanged (patch projection, class token and positions,
// bidirectional attention, the classification head and its loss are all
// built through the LayerFactory). Synthetic labelled images
// (data.kind = "synthetic" with model.name = "vit"), 8x8 pixels in 2
// channels cut into 4 patches of 4x4 (5 tokens with the class token), 5
// classes; tolerances are the harness's (testing::Tolerance).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

using testing::world_size;

const testing::TinyModel tiny_vit = testing::tiny_image_model("vit", "", {});

TEST(VitConfig, DerivesItsSequenceAndOutputs) {
  const RunConfig c = tiny_vit();
  EXPECT_EQ(c.model.seq_len, 8 * 8 * 2);
  EXPECT_EQ(c.model.vocab, 5);
  // The effective configuration reads back as the same run.
  const RunConfig again = parse_run_config(to_toml(c), "<to_toml>");
  EXPECT_EQ(again.model.image_size, 8);
  EXPECT_EQ(again.model.classes, 5);
  EXPECT_EQ(again.model.seq_len, c.model.seq_len);
}

TEST(VitConfig, RefusesWhatDoesNotApply) {
  EXPECT_NE(
      tiny_vit.config_error({"model.patch_size=3"}).find("not divisible by model.patch_size = 3"),
      std::string::npos);
  EXPECT_NE(
      tiny_vit.config_error({"model.seq_len=16"}).find("does not apply to model.name = \"vit\""),
      std::string::npos);
  EXPECT_NE(tiny_vit.config_error({"model.vocab=16"}).find("vocab"), std::string::npos);
  EXPECT_NE(tiny_vit.config_error({"model.rope_theta=1.0"}).find("llama"), std::string::npos);
  EXPECT_NE(
      tiny_vit.config_error({"data.kind=\"tokens\"", "data.path=\"x.bin\""}).find("reads images"),
      std::string::npos);
  EXPECT_NE(tiny_vit.config_error({"data.flip=true"}).find("data.kind = \"images\" only"),
            std::string::npos);
  // The sequence strategies attend causally: refused, naming the key.
  const std::string sequence = tiny_vit.config_error({"parallel.sequence.size=2"});
  EXPECT_NE(sequence.find("parallel.sequence"), std::string::npos) << sequence;
  EXPECT_NE(sequence.find("causally"), std::string::npos) << sequence;
  // A GPT refuses the ViT's keys.
  try {
    testing::tiny_gpt_config({"model.classes=10"});
    ADD_FAILURE() << "model.classes accepted for gpt";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("applies to model.name = \"vit\" only"), std::string::npos)
        << e.what();
  }
}

// model.activation and model.norm_eps: defaults as before, written back by
// to_toml, refused when invalid (naming the key and the valid values) and
// refused for gpt, whose MLP and LayerNorms they would not reach.
TEST(VitConfig, ActivationAndNormEps) {
  const RunConfig d = tiny_vit();
  EXPECT_EQ(d.model.activation, "gelu_tanh");
  EXPECT_DOUBLE_EQ(d.model.norm_eps, 1e-5);
  const RunConfig c = tiny_vit({"model.activation=\"gelu\"", "model.norm_eps=1e-12"});
  EXPECT_EQ(c.model.activation, "gelu");
  EXPECT_DOUBLE_EQ(c.model.norm_eps, 1e-12);
  const RunConfig again = parse_run_config(to_toml(c), "<to_toml>");
  EXPECT_EQ(again.model.activation, "gelu");
  EXPECT_DOUBLE_EQ(again.model.norm_eps, 1e-12);
  const std::string relu = tiny_vit.config_error({"model.activation=\"relu\""});
  EXPECT_NE(relu.find("model.activation"), std::string::npos) << relu;
  EXPECT_NE(relu.find("\"gelu_tanh\""), std::string::npos) << relu;
  EXPECT_NE(relu.find("\"gelu\""), std::string::npos) << relu;
  const std::string eps = tiny_vit.config_error({"model.norm_eps=0"});
  EXPECT_NE(eps.find("model.norm_eps"), std::string::npos) << eps;
  for (const std::string& key : {"model.activation=\"gelu\"", "model.norm_eps=1e-6"}) {
    try {
      testing::tiny_gpt_config({key});
      ADD_FAILURE() << key << " accepted for gpt";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(key.substr(0, key.find('='))), std::string::npos) << what;
      EXPECT_NE(what.find("not to model.name = \"gpt\""), std::string::npos) << what;
    }
  }
}

// Both keys reach the model: the first loss moves with each of them.
TEST(VitSerial, ActivationAndNormEpsAct) {
  const std::vector<std::string> one = {"train.steps=1"};
  const double tanh_loss = testing::serial_record(tiny_vit.serial(one)).losses[0];
  std::vector<std::string> exact = one;
  exact.push_back("model.activation=\"gelu\"");
  std::vector<std::string> wide_eps = one;
  wide_eps.push_back("model.norm_eps=0.5");
  const double exact_loss = testing::serial_record(tiny_vit.serial(exact)).losses[0];
  const double eps_loss = testing::serial_record(tiny_vit.serial(wide_eps)).losses[0];
  EXPECT_NE(exact_loss, tanh_loss);
  EXPECT_NE(eps_loss, tanh_loss);
}

TEST(VitSerial, Learns) {
  const testing::RunRecord r = testing::serial_record(tiny_vit.serial({"train.steps=40"}));
  ASSERT_EQ(r.losses.size(), 40u);
  EXPECT_LT(r.losses.back(), 0.5 * r.losses.front());
}

class VitLayouts : public ::testing::TestWithParam<testing::Mix> {};
TEST_P(VitLayouts, MatchSerial) {
  // tp1d: 5 classes over 2 ranks, the head's class slice is padded.
  testing::expect_mix_matches_serial(GetParam(), tiny_vit);
}
INSTANTIATE_TEST_SUITE_P(TwoRanks, VitLayouts, ::testing::ValuesIn(testing::two_rank_mixes()),
                         testing::mix_name);

// Hugging Face ViT's defaults (exact GELU, LayerNorm eps 1e-12) under tp1d.
TEST(VitTp1d, ExactGeluMatchesSerial) {
  const std::vector<std::string> hf = {"model.activation=\"gelu\"", "model.norm_eps=1e-12"};
  std::vector<std::string> tp = hf;
  tp.push_back("parallel.tensor.size=2");
  testing::expect_equivalent(tiny_vit.serial(hf), tiny_vit(tp));
}

TEST(VitRecompute, FullAndSelectiveMatchSerial) {
  testing::expect_equivalent(tiny_vit.serial(),
                             tiny_vit({"parallel.data=2", "train.recompute=\"full\""}));
  testing::expect_equivalent(tiny_vit.serial(),
                             tiny_vit({"parallel.data=2", "train.recompute=\"selective\""}));
}

// The chunks memory plugin: parameters, gradients and AdamW states in
// chunks of 16 KiB under a budget smaller than their sum, moved to and from
// host memory as the blocks run, auto and static placement.
TEST(VitChunks, OnHostMatchesSerial) {
  for (const auto& placement : std::vector<std::vector<std::string>>{
           {"memory.placement=\"auto\""},
           {"memory.placement=\"static\"", "memory.param_fraction=0.3"}}) {
    SCOPED_TRACE(placement[0]);
    std::vector<std::string> o = {"parallel.data=2", "memory.compute_budget=\"256KiB\"",
                                  "memory.offload=\"host\"", "memory.chunk_size=\"16KiB\""};
    o.insert(o.end(), placement.begin(), placement.end());
    testing::expect_equivalent(tiny_vit.serial(), tiny_vit(o));
  }
}

// bf16 against fp32, as tests/mpi/precision does for GPT: the runs do not
// follow one trajectory, so what is bounded is how well each trains. On a
// classifier the final loss is small and its relative error large, so the
// bound is absolute: within 0.05 nats of fp32's final loss (2^-9 per
// rounding, ~10 roundings in series per forward, on losses of order 1).
TEST(VitBf16, TrainsLikeFp32) {
  modules::register_builtin_models();
  const std::vector<std::string> base = {"parallel.data=2", "train.steps=60"};
  std::vector<std::string> low = base;
  low.push_back("train.precision=\"bf16\"");
  const testing::RunRecord a = testing::run_and_record(tiny_vit(base), testing::world_group());
  const testing::RunRecord b = testing::run_and_record(tiny_vit(low), testing::world_group());
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_LT(a.losses.back(), 0.5 * a.losses.front());
  EXPECT_NE(a.losses[5], b.losses[5]);
  EXPECT_NEAR(b.losses.back(), a.losses.back(), 0.05);
  if (testing::world_rank() == 0) {
    std::printf("[vit bf16] step 6 loss fp32 %.9f bf16 %.9f; final loss fp32 %.9f bf16 %.9f\n",
                a.losses[5], b.losses[5], a.losses.back(), b.losses.back());
  }
}

// ---- [eval]: held-out loss and accuracy, forward only ------------------------

EvalResult train_and_evaluate(const RunConfig& config, const comm::ProcessGroupPtr& group) {
  modules::register_builtin_models();
  Engine engine(config, group, [](const RunConfig& c) { return data::make_source(c); });
  engine.train();
  return engine.evaluate();
}

// 37 held-out samples: not a multiple of the data-parallel size or the
// micro-batch, so ranks read unequal shares and the last batch is short.
const std::vector<std::string> kEval = {"eval.samples=37", "eval.every=4", "train.micro_batch=2",
                                        "train.global_batch=8"};

void expect_eval_matches_serial(const std::vector<std::string>& mix) {
  std::vector<std::string> parallel = kEval;
  parallel.insert(parallel.end(), mix.begin(), mix.end());
  const EvalResult s = train_and_evaluate(tiny_vit.serial(kEval), testing::self_group());
  const EvalResult p = train_and_evaluate(tiny_vit(parallel), testing::world_group());
  EXPECT_EQ(s.samples, 37);
  EXPECT_EQ(p.samples, 37);
  EXPECT_NEAR(p.loss, s.loss, 1e-5 * s.loss) << mix.front();
  EXPECT_GE(s.accuracy, 0.0);
  // The same predictions up to a near tie (parameters agree to ~1e-5).
  EXPECT_NEAR(p.accuracy, s.accuracy, 1.0 / 37 + 1e-12) << mix.front();
}

TEST(VitEval, DataParallelMatchesSerial) { expect_eval_matches_serial({"parallel.data=2"}); }
TEST(VitEval, Tp1dMatchesSerial) { expect_eval_matches_serial({"parallel.tensor.size=2"}); }
TEST(VitEval, PipelineMatchesSerial) {
  expect_eval_matches_serial({"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""});
}
TEST(VitEval, Zero3MatchesSerial) { expect_eval_matches_serial({"parallel.zero.stage=3"}); }

// ---- the tensor-parallel grids (4 and 8 ranks; ctest runs only *Grid* there) ----

// The patch projection, class token and positions run whole on every rank
// and enter the grid's layout (batch and features cut); the head's 5
// classes are cut (padded) over the batch dimension of the grid.
TEST(VitGrid, MatchesSerial) {
  const auto grids = testing::grid_layouts();
  if (grids.empty()) GTEST_SKIP() << "runs at 4 (2d) and 8 ranks (2.5d, 3d)";
  for (const auto& grid : grids) {
    SCOPED_TRACE(grid[1]);
    testing::expect_equivalent(tiny_vit.serial(), tiny_vit(grid));
  }
}

// Micro-batches of 2 rows cut into blocks of 2: of 37 held-out samples the
// last does not fill a block and is not scored. The other 36 give the
// serial eval of those 36, accuracy included (whole_logits gathers the
// classes and rows the grid cut).
TEST(VitGrid, EvalScoresWholeBlocks) {
  if (world_size() != 4) GTEST_SKIP() << "runs at 4 ranks (a 2 x 2 grid)";
  std::vector<std::string> grid = kEval;
  grid.insert(grid.end(), {"parallel.tensor.size=4", "parallel.tensor.mode=\"2d\""});
  std::vector<std::string> whole = kEval;
  whole.push_back("eval.samples=36");
  const EvalResult s = train_and_evaluate(tiny_vit.serial(whole), testing::self_group());
  const EvalResult p = train_and_evaluate(tiny_vit(grid), testing::world_group());
  EXPECT_EQ(s.samples, 36);
  EXPECT_EQ(p.samples, 36);
  EXPECT_NEAR(p.loss, s.loss, 1e-5 * s.loss);
  ASSERT_GE(s.accuracy, 0.0);
  EXPECT_NEAR(p.accuracy, s.accuracy, 1.0 / 36 + 1e-12);
}

TEST(GptEval, LossWithoutAccuracyUnderDataParallel) {
  const std::vector<std::string> ev = {"eval.samples=24", "train.steps=6"};
  std::vector<std::string> dp = ev;
  dp.push_back("parallel.data=2");
  std::vector<std::string> one = ev;
  one.push_back("parallel.data=1");
  const EvalResult s = train_and_evaluate(testing::tiny_gpt_config(one), testing::self_group());
  const EvalResult p = train_and_evaluate(testing::tiny_gpt_config(dp), testing::world_group());
  EXPECT_NEAR(p.loss, s.loss, 1e-5 * s.loss);
  EXPECT_LT(s.accuracy, 0.0);  // a language model is not a classifier
}

// Sequence parallelism: each rank scores its positions of every held-out
// sample (ring's zigzag halves, ulysses' contiguous quarter... of 2 ranks;
// megatron's whole sequence under tp1d), and the loss is the serial one.
TEST(GptEval, SequenceParallelMatchesSerial) {
  const std::vector<std::string> ev = {"eval.samples=10", "train.steps=4",
                                       "train.micro_batch=2", "train.global_batch=4"};
  std::vector<std::string> one = ev;
  one.push_back("parallel.data=1");
  const EvalResult s = train_and_evaluate(testing::tiny_gpt_config(one), testing::self_group());
  ASSERT_GT(s.loss, 0.0);
  for (const std::vector<std::string>& mix :
       {std::vector<std::string>{"parallel.sequence.size=2", "parallel.sequence.mode=\"ring\""},
        {"parallel.sequence.size=2", "parallel.sequence.mode=\"ulysses\""},
        {"parallel.tensor.size=2", "parallel.sequence.mode=\"megatron\""}}) {
    SCOPED_TRACE(mix[1]);
    std::vector<std::string> sp = ev;
    sp.insert(sp.end(), mix.begin(), mix.end());
    const EvalResult p = train_and_evaluate(testing::tiny_gpt_config(sp), testing::world_group());
    EXPECT_EQ(p.samples, 10);
    EXPECT_NEAR(p.loss, s.loss, 1e-5 * s.loss);
    EXPECT_LT(p.accuracy, 0.0);
  }
}

TEST(EvalConfig, RefusesWhatDoesNotApply) {
  EXPECT_NE(tiny_vit.config_error({"eval.path=\"x.h5\""}).find("another seed"), std::string::npos);
  EXPECT_NE(tiny_vit.config_error({"eval.every=-1"}).find("eval.every"), std::string::npos);
  EXPECT_NE(tiny_vit.config_error({"eval.bogus=1"}).find("bogus"), std::string::npos);
}

}  // namespace
}  // namespace kolos
