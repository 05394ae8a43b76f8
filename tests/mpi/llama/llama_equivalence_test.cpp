// LLaMA against the serial run of the same model: the parallel plugins run
// it unchanged (RMSNorm, RoPE, grouped-query attention, SwiGLU and the
// untied LM head are all built through the LayerFactory). 20 steps,
// per-step losses within 1e-5 relative, final gathered parameters within
// 5e-5 absolute (testing::Tolerance).
//
// model.vocab = 65 divides by no tensor size here, so the token embedding's
// and the untied LM head's vocabulary pieces are padded. Clipping is active
// (optim.grad_clip), so the global gradient norm over the sharded pieces
// matters from the first step.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "equivalence.h"

namespace kolos {
namespace {

using testing::world_size;

// hidden 32, 4 heads (head dimension 8), SwiGLU width 96 (the default rule).
std::vector<std::string> llama(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"model.name=llama", "model.vocab=65",
                                       "model.rope_theta=500.0", "optim.grad_clip=0.05"});
  return overrides;
}

RunConfig serial(std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.data=1");
  return testing::tiny_gpt_config(llama(std::move(overrides)));
}

RunConfig parallel(std::vector<std::string> overrides) {
  return testing::tiny_gpt_config(llama(std::move(overrides)));
}

std::vector<std::string> tensor(const std::string& mode, int size,
                                std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.tensor.size=" + std::to_string(size));
  overrides.push_back("parallel.tensor.mode=" + mode);
  return overrides;
}

TEST(LlamaSerial, ResolvesItsDefaults) {
  const RunConfig c = serial();
  EXPECT_EQ(c.model.kv_heads, c.model.heads);
  EXPECT_EQ(c.model.ffn_hidden, 96);  // ceil(8/3 * 32) = 86, up to a multiple of 32
}

TEST(LlamaDataParallel, MatchesSerial) {
  REQUIRE_RANKS(2, 4);
  testing::expect_equivalent(serial(), parallel({"parallel.data=" + std::to_string(world_size())}));
}

TEST(LlamaTp1d, MatchesSerial) {
  REQUIRE_RANKS(2, 4);
  testing::expect_equivalent(serial(), parallel(tensor("1d", world_size())));
}

TEST(LlamaTp1d, WithDataParallelAndAccumulationMatchesSerial) {
  // tp 2 x dp 2; each dp rank: 2 micro-batches of 2.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial({"train.micro_batch=16"}),
                             parallel(tensor("1d", 2, {"train.micro_batch=2"})));
}

TEST(LlamaTp1d, GroupedQueryAttentionMatchesSerial) {
  // 8 query heads in 2 groups, one key/value head per group; tp 2 keeps one
  // group per rank (x dp 2 at 4 ranks).
  REQUIRE_RANKS(2, 4);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  std::vector<std::string> mix = tensor("1d", 2, gqa);
  mix.push_back("parallel.data=" + std::to_string(world_size() / 2));
  testing::expect_equivalent(serial(gqa), parallel(mix));
}

TEST(LlamaDataParallel, MultiQueryAttentionMatchesSerial) {
  // One key/value head for all 4 query heads.
  REQUIRE_RANKS(2, 4);
  testing::expect_equivalent(
      serial({"model.kv_heads=1"}),
      parallel({"model.kv_heads=1", "parallel.data=" + std::to_string(world_size())}));
}

TEST(LlamaTp2d, MatchesSerial) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), parallel(tensor("2d", 4)));
}

TEST(LlamaTp2d, GroupedQueryAttentionMatchesSerial) {
  REQUIRE_RANKS(4);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  testing::expect_equivalent(serial(gqa), parallel(tensor("2d", 4, gqa)));
}

TEST(LlamaTp2p5d, GroupedQueryAttentionMatchesSerial) {
  // depth 2 x 2 x 2.
  REQUIRE_RANKS(8);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  testing::expect_equivalent(
      serial(gqa),
      parallel(
          tensor("2.5d", 8, {"model.heads=8", "model.kv_heads=2", "parallel.tensor.depth=2"})));
}

TEST(LlamaTp3d, GroupedQueryAttentionMatchesSerial) {
  // 2 x 2 x 2: a column layer's output features cut over one grid
  // dimension, a row layer's over another.
  REQUIRE_RANKS(8);
  const std::vector<std::string> gqa = {"model.heads=8", "model.kv_heads=2"};
  testing::expect_equivalent(serial(gqa), parallel(tensor("3d", 8, gqa)));
}

TEST(LlamaPipeline, WithZero3MatchesSerial) {
  // 2 stages x (world / 2) data-parallel ranks under ZeRO-3 (at 2 ranks, 2
  // stages alone); 4 micro-batches of 2 per data-parallel rank.
  REQUIRE_RANKS(2, 4);
  const int dp = world_size() / 2;
  const std::vector<std::string> shape = {"train.micro_batch=2",
                                          "train.global_batch=" + std::to_string(8 * dp)};
  std::vector<std::string> mix = shape;
  mix.insert(mix.end(), {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\"",
                         "parallel.data=" + std::to_string(dp)});
  if (dp > 1) mix.push_back("parallel.zero.stage=3");
  testing::expect_equivalent(serial(shape), parallel(mix));
}

TEST(LlamaPipeline, WithTp1dAndGqaMatchesSerial) {
  // 2 stages x tp 2: the untied head's vocabulary slice on the last stage.
  REQUIRE_RANKS(4);
  const std::vector<std::string> base = {"train.micro_batch=2", "train.global_batch=8",
                                         "model.heads=8", "model.kv_heads=2"};
  std::vector<std::string> mix = tensor("1d", 2, base);
  mix.insert(mix.end(), {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""});
  testing::expect_equivalent(serial(base), parallel(mix));
}

}  // namespace
}  // namespace kolos
