// Shared by the mixture-of-experts tests (moe_test.cpp, moe_features_test.cpp):
// REQUIRE_RANKS, the tiny mixtral's configs (serial and parallel), block 0's
// MoE layer and its pieces, and engines resumed from a checkpoint under
// another layout.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/model.h"
#include "kolos/core/training_state.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos::moe_test {

using testing::world_size;

// hidden 32, 4 heads, 4 experts of SwiGLU width 96, top 2.
inline std::vector<std::string> mixtral(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(),
                   {"model.name=mixtral", "model.vocab=65", "model.experts=4", "model.top_k=2",
                    "model.aux_loss_coef=0.05", "optim.grad_clip=0.05"});
  return overrides;
}
inline RunConfig serial(std::vector<std::string> overrides = {}) {
  overrides.push_back("parallel.data=1");
  return testing::tiny_gpt_config(mixtral(std::move(overrides)));
}
inline RunConfig parallel(std::vector<std::string> overrides) {
  return testing::tiny_gpt_config(mixtral(std::move(overrides)));
}
inline std::string dp_all() { return "parallel.data=" + std::to_string(world_size()); }

inline std::string ep(int64_t size) { return "parallel.expert.size=" + std::to_string(size); }

// A serial model of `c` (seed 3) and its layer factory.
struct Built {
  std::shared_ptr<Model> model;
  std::shared_ptr<LayerFactory> factory;
};
inline Built build(const RunConfig& c) {
  modules::register_builtin_models();
  Built b;
  b.factory = make_serial_layer_factory();
  torch::manual_seed(3);
  b.model = build_model(c.model, *b.factory);
  return b;
}

inline torch::nn::Module& child(torch::nn::Module& m, const std::string& path) {
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
inline Moe moe_of(Model& model, int64_t experts) {
  Moe m;
  auto& block = *model.blocks()[1].second;  // h.0
  m.layer = dynamic_cast<Layer*>(&child(block, "mlp"));
  m.router = child(block, "mlp.router").named_parameters()["weight"];
  for (int64_t e = 0; e < experts; ++e) {
    m.experts.push_back(dynamic_cast<Layer*>(&child(block, "mlp.experts." + std::to_string(e))));
  }
  return m;
}

// An engine for `c` over the world, on its configured data source.
inline std::unique_ptr<Engine> engine_for(const RunConfig& c) {
  modules::register_builtin_models();
  return std::make_unique<Engine>(c, testing::world_group(),
                                  [](const RunConfig& r) { return data::make_source(r); });
}

// `a` and `b` hold the same global parameters (gathered_parameters()).
inline void expect_same_parameters(Engine& a, Engine& b) {
  const auto pa = a.gathered_parameters(), pb = b.gathered_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
}

// A checkpoint saved after 3 steps of the run of `saved_mix` loads into the
// run of `loaded_mix`: the same global parameters, and the next step's loss
// is the same.
inline void expect_resumes_across(const std::vector<std::string>& saved_mix,
                                  const std::vector<std::string>& loaded_mix,
                                  const std::string& tag) {
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

}  // namespace kolos::moe_test
