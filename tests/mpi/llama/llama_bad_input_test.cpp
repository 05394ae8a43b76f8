// Bad input for LLaMA: ConfigErrors naming the key, what was found and what
// would work; GPT refuses LLaMA's keys and LLaMA GPT's mlp_ratio. Checked as
// `kolos check` does (testing::config_error: the config read and the run
// planned, plugins configured, at the fewest ranks its mesh fits).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "equivalence.h"

namespace kolos {
namespace {

using testing::config_error;

void expect_has(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in: " << message;
}

std::vector<std::string> llama(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "model.name=llama");
  return overrides;
}

TEST(LlamaBadInput, TheTinyModelIsAccepted) {
  // The cases below fail for their one key, not for the base config.
  EXPECT_EQ(config_error(llama({})), "");
  EXPECT_EQ(config_error(llama({"model.heads=8", "model.kv_heads=2", "parallel.tensor.size=2"})),
            "");
}

TEST(LlamaBadInput, KvHeadsThatDoNotDivideHeads) {
  const std::string m = config_error(llama({"model.kv_heads=3"}));
  expect_has(m, "model.kv_heads = 3 does not divide model.heads = 4");
  expect_has(m, "use kv_heads = 1, 2, 4");
  expect_has(config_error(llama({"model.kv_heads=8"})), "model.kv_heads = 8 does not divide");
}

TEST(LlamaBadInput, OddHeadDimensionForRope) {
  const std::string m = config_error(llama({"model.hidden=36"}));  // 36 / 4 = 9
  expect_has(m, "model.hidden / model.heads = 36 / 4 = 9 is odd");
  expect_has(m, "use hidden = 40");
}

TEST(LlamaBadInput, KvHeadsNotDivisibleByTensorSize) {
  std::string m =
      config_error(llama({"model.heads=8", "model.kv_heads=2", "parallel.tensor.size=4"}));
  expect_has(m,
             "model.kv_heads = 2 does not divide into the 4 key/value-head groups of tensor "
             "mode \"1d\" at size 4");
  expect_has(m, "use model.kv_heads = 4");
  expect_has(m, "or a tensor size of 1, 2");
  m = config_error(llama(
      {"model.heads=4", "model.kv_heads=1", "parallel.tensor.size=4", "parallel.tensor.mode=2d"}));
  expect_has(m, "model.kv_heads = 1 does not divide into the 2 key/value-head groups");
}

TEST(LlamaBadInput, FfnHiddenNotDivisibleByTensorSize) {
  const std::string m = config_error(llama({"model.ffn_hidden=90", "parallel.tensor.size=4"}));
  expect_has(m, "model.ffn_hidden = 90 does not divide into the 4 MLP column blocks");
  expect_has(m, "use model.ffn_hidden = 88 or 92");
}

TEST(LlamaBadInput, OutOfRangeValues) {
  expect_has(config_error(llama({"model.rope_theta=0"})), "model.rope_theta");
  expect_has(config_error(llama({"model.norm_eps=-1e-5"})), "model.norm_eps");
  expect_has(config_error(llama({"model.kv_heads=-1"})), "model.kv_heads");
  expect_has(config_error(llama({"model.ffn_hidden=-4"})), "model.ffn_hidden");
}

TEST(LlamaBadInput, GptRefusesLlamaKeys) {
  for (const std::string key : {"kv_heads=2", "rope_theta=10000.0", "ffn_hidden=96"}) {
    const std::string m = config_error({"model." + key});
    expect_has(m, "model." + key.substr(0, key.find('=')));
    expect_has(m, "applies to model.name = \"llama\" only, not to model.name = \"gpt\"");
  }
  // norm_eps is vit's too (its LayerNorms' eps); gpt's is fixed.
  const std::string m = config_error({"model.norm_eps=1e-6"});
  expect_has(m, "model.norm_eps");
  expect_has(m, "applies to model.name = \"llama\" and \"vit\", not to model.name = \"gpt\"");
}

TEST(LlamaBadInput, LlamaRefusesMlpRatio) {
  const std::string m = config_error(llama({"model.mlp_ratio=4"}));
  expect_has(m, "model.mlp_ratio");
  expect_has(m, "the SwiGLU width of model.name = \"llama\" is model.ffn_hidden");
}

}  // namespace
}  // namespace kolos
