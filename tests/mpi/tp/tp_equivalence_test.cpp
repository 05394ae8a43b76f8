// Tensor parallelism (tp1d, tp2d, tp2p5d, tp3d) against the serial run of
// the same GPT: 20 steps, per-step losses within 1e-5 relative, final
// gathered parameters within 5e-5 absolute (testing::Tolerance).
//
// model.vocab = 65 and model.seq_len = 15 divide by no grid size here, so
// the token and position embeddings' pieces are padded (their placements
// say so) and the vocabulary-parallel loss sees slices of unequal length.
// Clipping is active (optim.grad_clip), so the global gradient norm over
// the tp-sharded pieces matters from the first step.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "equivalence.h"

namespace kolos {
namespace {

using testing::world_size;

std::vector<std::string> with(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(),
                   {"model.vocab=65", "model.seq_len=15", "optim.grad_clip=0.05"});
  return overrides;
}

RunConfig serial(std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.data=1");
  return testing::tiny_gpt_config(with(std::move(overrides)));
}

RunConfig tensor(const std::string& mode, int size, std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.tensor.size=" + std::to_string(size));
  overrides.push_back("parallel.tensor.mode=" + mode);
  return testing::tiny_gpt_config(with(std::move(overrides)));
}

TEST(Tp1d, MatchesSerial) {
  REQUIRE_RANKS(2, 4);
  testing::expect_equivalent(serial(), tensor("1d", world_size()));
}

TEST(Tp1d, AccumulationAndDataParallelMatchSerial) {
  // tp 2 x dp 2; each dp rank: 2 micro-batches of 2.
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial({"train.micro_batch=16"}),
                             tensor("1d", 2, {"train.micro_batch=2"}));
}

TEST(Tp1d, WithZero3MatchesSerial) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), tensor("1d", 2, {"parallel.zero.stage=3"}));
}

TEST(Tp1d, WithZero1MatchesSerial) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), tensor("1d", 2, {"parallel.zero.stage=1"}));
}

TEST(Tp2d, MatchesSerial) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(serial(), tensor("2d", 4));
}

TEST(Tp2d, ChosenByPluginNameMatchesSerial) {
  REQUIRE_RANKS(4);
  RunConfig config = tensor("2d", 4, {"plugins.layers=tp2d"});
  testing::expect_equivalent(serial(), config);
}

TEST(Tp2d, WithDataParallelAndZero2MatchesSerial) {
  REQUIRE_RANKS(8);
  testing::expect_equivalent(serial(), tensor("2d", 4, {"parallel.zero.stage=2"}));
}

TEST(Tp2p5d, MatchesSerial) {
  REQUIRE_RANKS(8);
  testing::expect_equivalent(serial(), tensor("2.5d", 8, {"parallel.tensor.depth=2"}));
}

TEST(Tp3d, MatchesSerial) {
  REQUIRE_RANKS(8);
  testing::expect_equivalent(serial(), tensor("3d", 8));
}

}  // namespace
}  // namespace kolos
