// What the sequence-parallel equivalence tests share: the rank counts a
// test runs at, and the configs they compare (the tiny GPT of
// testing::tiny_gpt_config, 8 steps with clipping active so that the
// gradient norm feeds every update, and a tiny LLaMA with RoPE).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "equivalence.h"

namespace kolos::testing::sequence {

// 8 steps, clipping at 0.05, then `overrides`.
inline std::vector<std::string> base(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"train.steps=8", "optim.grad_clip=0.05"});
  return overrides;
}

// The serial reference (one data rank) of `overrides`.
inline RunConfig serial(std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.data=1");
  return tiny_gpt_config(base(std::move(overrides)));
}

// sp ranks of sequence mode `mode` (x whatever else `overrides` sets).
inline RunConfig mode(const std::string& mode, int sp, std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.sequence.size=" + std::to_string(sp));
  overrides.push_back("parallel.sequence.mode=\"" + mode + "\"");
  return tiny_gpt_config(base(std::move(overrides)));
}

// The tiny LLaMA in place of the GPT (65 tokens, RoPE theta 500).
inline std::vector<std::string> llama(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(),
                   {"model.name=llama", "model.vocab=65", "model.rope_theta=500.0"});
  return overrides;
}

}  // namespace kolos::testing::sequence

namespace kolos {
// What the sequence equivalence tests call unqualified.
using testing::world_size;
using testing::sequence::base;
using testing::sequence::llama;
using testing::sequence::serial;
}  // namespace kolos
