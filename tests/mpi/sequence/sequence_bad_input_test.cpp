// Bad input for sequence parallelism: ConfigErrors naming the key, what was
// found and what would work. Checked as `kolos check` does
// (testing::config_error: the config read and the run planned, plugins
// configured, at the fewest ranks its mesh fits).
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

// The tiny GPT: 4 heads, 16 positions.
std::vector<std::string> sp(int size, std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.sequence.size=" + std::to_string(size));
  return overrides;
}

TEST(SequenceBadInput, TheTinyModelIsAccepted) {
  // The cases below fail for their one key, not for the base config.
  EXPECT_EQ(config_error(sp(2)), "");
  EXPECT_EQ(config_error(sp(4, {"parallel.sequence.mode=\"ulysses\""})), "");
  EXPECT_EQ(config_error(sp(2, {"parallel.tensor.size=2"})), "");
}

TEST(SequenceBadInput, HeadsNotDivisibleBySequenceSize) {
  std::string m = config_error(sp(8));
  expect_has(m, "parallel.sequence.size = 8");
  expect_has(m, "the 4 attention heads (model.heads) do not divide by 8");
  expect_has(m, "sequence sizes that divide them: 2, 4");
  // Per tensor rank: 4 heads / tensor 2 = 2 per rank.
  m = config_error(sp(4, {"parallel.tensor.size=2"}));
  expect_has(m, "the 2 attention heads of each tensor rank (model.heads = 4 / tensor 2)");
  expect_has(m, "do not divide by 4; sequence sizes that divide them: 2.");
}

TEST(SequenceBadInput, SequenceLengthNotDivisible) {
  const std::string m = config_error(sp(4, {"model.seq_len=18"}));
  expect_has(m, "model.seq_len = 18 does not divide into the 4 sequence ranks");
  expect_has(m, "nearest valid lengths: 16 or 20");
}

TEST(SequenceBadInput, SequenceSizeLargerThanTheSequence) {
  const std::string m = config_error(sp(4, {"model.seq_len=2"}));
  expect_has(m, "parallel.sequence.size = 4 is larger than the sequence (model.seq_len = 2)");
  expect_has(m, "model.seq_len = 4");
}

TEST(SequenceBadInput, UnknownMode) {
  const std::string m = config_error(sp(2, {"parallel.sequence.mode=\"zigzag\""}));
  expect_has(m, "parallel.sequence.mode");
  expect_has(m, "zigzag");
  expect_has(m, "ulysses");
}

// Sequence mode megatron over a tensor group of `tp` (0: no tensor key).
std::vector<std::string> megatron(int tp, std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.sequence.mode=\"megatron\"");
  if (tp > 0) overrides.push_back("parallel.tensor.size=" + std::to_string(tp));
  return overrides;
}

TEST(MegatronBadInput, TheTinyModelIsAccepted) {
  EXPECT_EQ(config_error(megatron(2)), "");
  EXPECT_EQ(config_error(megatron(4, {"parallel.tensor.mode=\"1d\""})), "");
  EXPECT_EQ(config_error(megatron(2, {"parallel.sequence.size=2"})), "");
  EXPECT_EQ(config_error(megatron(2, {"parallel.sequence.size=1"})), "");
}

TEST(MegatronBadInput, WithoutTp1d) {
  std::string m = config_error(megatron(0));
  expect_has(m, "parallel.tensor");
  expect_has(m,
             "sequence mode \"megatron\" splits the sequence over the tensor-parallel group "
             "of tensor mode \"1d\"; found parallel.tensor.size = 1.");
  expect_has(m,
             "Use parallel.tensor = { size = 2, mode = \"1d\" }, or sequence mode "
             "\"ulysses\" or \"ring\".");
  // The size it asked for is the one suggested.
  m = config_error(megatron(0, {"parallel.sequence.size=4"}));
  expect_has(m,
             "found parallel.tensor.size = 1. Use parallel.tensor = { size = 4, mode = \"1d\" }");
  m = config_error(megatron(4, {"parallel.tensor.mode=\"2d\""}));
  expect_has(m, "parallel.tensor.mode");
  expect_has(m, "found layers plugin `tp2d` (parallel.tensor.mode = \"2d\")");
}

TEST(MegatronBadInput, SizesThatDisagree) {
  const std::string m = config_error(megatron(2, {"parallel.sequence.size=4"}));
  expect_has(m,
             "parallel.sequence.size = 4 with sequence mode \"megatron\": its sequence group "
             "is the tensor group (parallel.tensor.size = 2), not an axis of its own; use "
             "size = 2 or leave size out.");
}

TEST(MegatronBadInput, SequenceLengthNotDivisible) {
  const std::string m = config_error(megatron(4, {"model.seq_len=18"}));
  expect_has(m, "model.seq_len = 18 does not divide into the 4 tensor ranks");
  expect_has(m, "nearest valid lengths: 16 or 20.");
}

TEST(MegatronBadInput, ChosenByPluginsWhileTheModeSaysOtherwise) {
  // plugins.sequence = "megatron" with size 2 and the default mode: the mesh
  // would get an sp axis of 2 besides the tensor group.
  const std::string m = config_error(
      {"plugins.sequence=\"megatron\"", "parallel.sequence.size=2", "parallel.tensor.size=2"});
  expect_has(m,
             "the sequence plugin `megatron` runs over the tensor group, but the mesh has a "
             "sequence axis of 2 ranks");
  expect_has(m, "select it with parallel.sequence.mode = \"megatron\" instead.");
}

std::vector<std::string> ring(int size, std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.sequence.mode=\"ring\"");
  return sp(size, std::move(overrides));
}

TEST(RingBadInput, AcceptsHeadsThatDoNotDivide) {
  // 4 heads over sp 8 (ulysses refuses it): ring keeps every head on every
  // rank. 16 positions = 2*8 chunks of 1.
  EXPECT_EQ(config_error(ring(8)), "");
  EXPECT_EQ(config_error(ring(2, {"model.heads=1", "parallel.tensor.size=1"})), "");
}

TEST(RingBadInput, SequenceLengthNotDivisibleByTwiceTheSize) {
  // 20 divides by sp 4 (ulysses takes it) but not by the 8 zigzag chunks.
  std::string m = config_error(ring(4, {"model.seq_len=20"}));
  expect_has(m,
             "model.seq_len = 20 does not divide into the 2*sp = 8 zigzag chunks of "
             "sequence mode \"ring\" (parallel.sequence.size = 4)");
  expect_has(m, "nearest valid lengths: 16 or 24.");
  // Shorter than the chunks: the one valid length above.
  m = config_error(ring(4, {"model.seq_len=6"}));
  expect_has(m, "model.seq_len = 6 does not divide into the 2*sp = 8 zigzag chunks");
  expect_has(m, "nearest valid lengths: 8.");
}

TEST(RingBadInput, TensorModesOtherThan1d) {
  const std::string m =
      config_error(ring(2, {"parallel.tensor.size=4", "parallel.tensor.mode=\"2d\""}));
  expect_has(m, "sequence mode \"ring\" composes with tensor mode \"1d\" only");
}

TEST(SequenceBadInput, ModeWithoutSequenceParallelism) {
  const std::string m = config_error({"parallel.sequence.mode=\"ulysses\""});
  expect_has(m, "parallel.sequence.mode");
  expect_has(m, "has no effect: parallel.sequence.size = 1");
}

TEST(SequenceBadInput, TensorModesOtherThan1d) {
  const std::string m =
      config_error(sp(2, {"parallel.tensor.size=4", "parallel.tensor.mode=\"2d\""}));
  expect_has(m, "sequence mode \"ulysses\" composes with tensor mode \"1d\" only");
}

TEST(SequenceBadInput, UnknownKeyOfTheUlyssesPlugin) {
  const std::string m = config_error(sp(2, {"parallel.sequence.chunks=2"}));
  expect_has(m, "parallel.sequence.chunks");
}

// sp = `size` of mode hybrid, Ulysses degree `ulysses`.
std::vector<std::string> hybrid(int size, int ulysses, std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.sequence.mode=\"hybrid\"");
  overrides.push_back("parallel.sequence.ulysses=" + std::to_string(ulysses));
  return sp(size, std::move(overrides));
}

TEST(HybridBadInput, TheTinyModelIsAccepted) {
  EXPECT_EQ(config_error(hybrid(4, 2)), "");
  EXPECT_EQ(config_error(hybrid(4, 1)), "");
  EXPECT_EQ(config_error(hybrid(4, 4)), "");
  EXPECT_EQ(config_error(hybrid(2, 2, {"parallel.tensor.size=2"})), "");
  // 12 = 4 zigzag chunks of 3 under 2 x 2, each group's 6 cut in 2.
  EXPECT_EQ(config_error(hybrid(4, 2, {"model.seq_len=12"})), "");
  EXPECT_EQ(config_error(hybrid(2, 2, {"parallel.pipeline.size=2"})), "");
}

TEST(HybridBadInput, SizesThatDoNotFactor) {
  const std::string m = config_error(hybrid(4, 3));
  expect_has(m, "parallel.sequence.ulysses: 3 does not divide parallel.sequence.size = 4");
  expect_has(m, "sizes that do not factor into ulysses x ring");
  expect_has(m, "Ulysses degrees that divide it: 1, 2, 4.");
  // Larger than the size.
  expect_has(config_error(hybrid(2, 4)), "4 does not divide parallel.sequence.size = 2");
}

TEST(HybridBadInput, TheUlyssesDegreeIsRequired) {
  const std::string m = config_error(sp(4, {"parallel.sequence.mode=\"hybrid\""}));
  expect_has(m, "sequence mode \"hybrid\" needs its Ulysses degree");
  expect_has(m, "parallel.sequence.ulysses to a divisor of parallel.sequence.size = 4 (1, 2, 4)");
}

TEST(HybridBadInput, TheUlyssesKeyIsRefusedUnderOtherModes) {
  for (const std::string mode : {"ulysses", "ring"}) {
    const std::string m = config_error(
        sp(2, {"parallel.sequence.mode=\"" + mode + "\"", "parallel.sequence.ulysses=2"}));
    expect_has(m, "parallel.sequence.ulysses");
    expect_has(m, "sequence plugin `" + mode + "`");
  }
  // No sequence plugin at size 1.
  expect_has(config_error({"parallel.sequence.ulysses=2"}), "parallel.sequence.ulysses");
}

TEST(HybridBadInput, HeadsNotDivisibleByTheUlyssesDegree) {
  std::string m = config_error(hybrid(4, 4, {"model.heads=2"}));
  expect_has(m, "parallel.sequence.ulysses: 4 (with parallel.sequence.size = 4)");
  expect_has(m, "the 2 attention heads (model.heads) do not divide by 4");
  expect_has(m, "Ulysses degrees that divide both them and the sequence size: 1, 2.");
  // Per tensor rank: 4 heads / tensor 2 = 2 per rank.
  m = config_error(hybrid(4, 4, {"parallel.tensor.size=2"}));
  expect_has(m, "the 2 attention heads of each tensor rank (model.heads = 4 / tensor 2)");
  expect_has(m, "do not divide by 4");
}

TEST(HybridBadInput, SequenceLengthNotDivisible) {
  // 2 x 2: multiples of 4 (18 divides by neither 4 nor the 8 of ring at sp 4).
  std::string m = config_error(hybrid(4, 2, {"model.seq_len=18"}));
  expect_has(m, "model.seq_len = 18 does not divide into the 4 zigzag chunks of a ring of 2");
  expect_has(m, "lengths must be multiples of 4; nearest valid lengths: 16 or 20.");
  // 1 x 4: the ring's 8 chunks.
  m = config_error(hybrid(4, 1, {"model.seq_len=20"}));
  expect_has(m, "lengths must be multiples of 8; nearest valid lengths: 16 or 24.");
  // 3 x 1 (odd a): 2 chunks of a ring of 1, each cut in 3.
  m = config_error(hybrid(3, 3, {"model.heads=3", "model.hidden=48"}));
  expect_has(m, "lengths must be multiples of 6; nearest valid lengths: 12 or 18.");
  // Shorter than the sequence ranks.
  m = config_error(hybrid(4, 2, {"model.seq_len=2"}));
  expect_has(m, "nearest valid lengths: 4.");
}

TEST(HybridBadInput, TensorModesOtherThan1d) {
  const std::string m =
      config_error(hybrid(2, 2, {"parallel.tensor.size=4", "parallel.tensor.mode=\"2d\""}));
  expect_has(m, "sequence mode \"hybrid\" composes with tensor mode \"1d\" only");
}

}  // namespace
}  // namespace kolos
