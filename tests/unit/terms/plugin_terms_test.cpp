// The plugins' memory terms (kolos/core/plugin_terms.h): every shipped
// plugin registers its own, rank_memory() asks the chosen ones and names a
// plugin that brought none, and a plugin registered from outside the core
// changes the estimate without a change to the core.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "kolos/core/plugin_terms.h"

namespace kolos {
namespace {

MemoryQuery gpt(int64_t dp = 4) {
  MemoryQuery q;
  q.model.layers = 4, q.model.hidden = 64, q.model.heads = 4, q.model.kv_heads = 4;
  q.model.seq = 32, q.model.vocab = 128, q.model.inner = 256;
  q.dp = dp;
  q.layers = "serial", q.pipeline = "single-stage", q.gradients = "dp";
  q.micro_batch = 2;
  q.bucket_bytes = 25.0 * 1024 * 1024;
  return q;
}

const MemoryTerm& term(const RankMemory& r, const std::string& name) {
  const auto it = std::find_if(r.terms.begin(), r.terms.end(),
                               [&](const MemoryTerm& t) { return t.name == name; });
  if (it == r.terms.end()) throw std::runtime_error("no term " + name);
  return *it;
}

// Every plugin file the build makes for a role with memory (all but the
// planner's) has registered terms for that role, with its role's hook.
TEST(PluginTerms, EveryShippedPluginBringsItsOwn) {
  namespace fs = std::filesystem;
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(KOLOS_PLUGIN_DIR)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("libkolos_", 0) != 0 || entry.path().extension() != ".so") continue;
    const std::string name = file.substr(9, file.size() - 9 - 3);
    if (name == "autoplan") continue;  // the planner role holds no model memory
    ++seen;
    const PluginTerms* t = plugin_terms(name);
    ASSERT_NE(t, nullptr) << file << " ships without memory terms (KOLOS_PLUGIN_TERMS)";
    const bool hook = t->role == "layers"     ? t->cut != nullptr
                      : t->role == "sequence" ? t->attention != nullptr
                      : t->role == "pipeline" ? t->in_flight != nullptr
                                              : t->states != nullptr;
    EXPECT_TRUE(hook) << name << " (" << t->role << ") lacks its role's hook";
  }
  EXPECT_GE(seen, 13) << "plugins in " << KOLOS_PLUGIN_DIR;
}

TEST(PluginTerms, AChosenPluginWithoutTermsIsNamedNotGuessed) {
  MemoryQuery q = gpt();
  q.gradients = "mystery";
  const RankMemory r = rank_memory(q);
  const MemoryTerm& states = term(r, "model states");
  EXPECT_EQ(states.bytes, 0);
  EXPECT_NE(states.detail.find("gradients plugin `mystery` registers no memory terms"),
            std::string::npos)
      << states.detail;
  q = gpt();
  q.sequence = "sideways", q.sp = 2;
  EXPECT_NE(term(rank_memory(q), "activations").detail.find("sequence plugin `sideways`"),
            std::string::npos);
}

// A gradients plugin from outside the core: half of dp's states. The
// estimate takes it by name.
void halved_states(const MemoryQuery& q, const RankPiece& p, std::vector<MemoryTerm>& out) {
  out.push_back({"parameters", q.element_bytes * p.params / 2, "half"});
}
KOLOS_PLUGIN_TERMS(PluginTerms{"halved", "gradients", nullptr, nullptr, nullptr, halved_states});

TEST(PluginTerms, APluginRegisteredOutsideTheCoreIsAsked) {
  MemoryQuery q = gpt();
  const double dp_params = term(rank_memory(q), "parameters").bytes;
  q.gradients = "halved";
  const RankMemory r = rank_memory(q);
  EXPECT_DOUBLE_EQ(term(r, "parameters").bytes, dp_params / 2);
  EXPECT_EQ(r.states, dp_params / 2);
}

TEST(PluginTerms, ZeroStagesShardMoreOfTheStates) {
  double last = 0;
  for (const char* g : {"zero3", "zero2", "zero1", "dp"}) {
    MemoryQuery q = gpt();
    q.bucket_bytes = 4096;  // zero2's staging: one bucket, below the model
    q.gradients = g;
    q.zero_stage = g[0] == 'z' ? g[4] - '0' : 0;
    const double states = rank_memory(q).states;
    EXPECT_GT(states, last) << g;
    last = states;
  }
  // ZeRO shards over dp x sp: the same states at dp 4 as at dp 2 x sp 2.
  MemoryQuery a = gpt(4), b = gpt(2);
  a.gradients = b.gradients = "zero1";
  b.sp = 2, b.sequence = "ulysses";
  EXPECT_DOUBLE_EQ(term(rank_memory(a), "optimizer states").bytes,
                   term(rank_memory(b), "optimizer states").bytes);
}

TEST(PluginTerms, LayersAndSequenceCutTheActivations) {
  MemoryQuery one = gpt(1), grid = gpt(1);
  one.tp = grid.tp = 4;
  one.layers = "tp1d", grid.layers = "tp2d";
  // tp1d keeps the norms' tensors whole; a grid cuts them too.
  EXPECT_GT(term(rank_memory(one), "activations").bytes,
            term(rank_memory(grid), "activations").bytes);
  // Megatron's sequence split cuts tp1d's norms.
  MemoryQuery meg = one;
  meg.sequence = "megatron";
  EXPECT_LT(term(rank_memory(meg), "activations").bytes,
            term(rank_memory(one), "activations").bytes);
  // The ring kernel keeps no seq x seq probabilities: selective
  // recomputation has nothing to drop there, and does under ulysses.
  MemoryQuery ring = gpt(1), uly = gpt(1);
  ring.sp = uly.sp = 2;
  ring.sequence = "ring", uly.sequence = "ulysses";
  const double ring_act = term(rank_memory(ring), "activations").bytes;
  const double uly_act = term(rank_memory(uly), "activations").bytes;
  ring.recompute = uly.recompute = "selective";
  EXPECT_EQ(term(rank_memory(ring), "activations").bytes, ring_act);
  EXPECT_LT(term(rank_memory(uly), "activations").bytes, uly_act);
  EXPECT_NE(term(rank_memory(ring), "temporaries").detail.find("ring kernel"), std::string::npos);
}

TEST(PluginTerms, ThePipelineCountsMicroBatchesInFlightPerStage) {
  MemoryQuery q = gpt(1);
  q.pp = 2, q.pipeline = "pipeline", q.accumulation = 8;
  q.settings["parallel.pipeline.schedule"] = "gpipe";
  const double gpipe = term(rank_memory_at(q, 0), "activations").bytes;
  q.settings["parallel.pipeline.schedule"] = "1f1b";
  const RankMemory first = rank_memory_at(q, 0);
  EXPECT_LT(term(first, "activations").bytes, gpipe);
  EXPECT_NE(term(first, "activations").detail.find("2 micro-batches in flight (1f1b)"),
            std::string::npos)
      << term(first, "activations").detail;
  // 1F1B's last stage holds one.
  EXPECT_NE(term(rank_memory_at(q, 1), "activations").detail.find("1 micro-batches in flight"),
            std::string::npos)
      << term(rank_memory_at(q, 1), "activations").detail;
}

TEST(PluginTerms, TheMemoryRoleHoldsTheStatesInTiers) {
  MemoryQuery q = gpt();
  q.memory = "chunks";
  q.settings["memory.compute_budget"] = "1MiB";
  const RankMemory r = rank_memory(q);
  EXPECT_EQ(term(r, "chunks, compute tier").bytes, 1024.0 * 1024);
  EXPECT_TRUE(term(r, "chunks, host tier").host);
  EXPECT_GT(r.host(), 0);
  EXPECT_THROW(term(r, "gradients"), std::runtime_error);  // not the gradients role's terms too
  q.settings["memory.offload"] = "nvme";
  EXPECT_EQ(term(rank_memory(q), "chunks, host tier").bytes, 0);
}

// The layouts the planner asks the tensor and sequence plugins about.
TEST(PluginTerms, LayoutsAreThePluginsToRefuse) {
  LayoutQuery l;
  l.heads = 6, l.kv_heads = 6, l.inner = 96, l.seq = 24, l.tp = 4;
  const auto problem = [&](const char* name) { return plugin_terms(name)->layout_problem(l); };
  EXPECT_NE(problem("tp1d"), "");  // 6 heads over 4
  l.tensor_mode = "2d";
  EXPECT_EQ(problem("tp2d"), "");  // over the grid's side, 2
  l.micro_batch = 3;
  EXPECT_EQ(problem("tp2d"), "tp: micro_batch not divisible by the grid's batch blocks");
  l.tp = 8, l.micro_batch = 0;
  EXPECT_EQ(problem("tp2d"), "tp: 2d needs a square tensor size");
  EXPECT_EQ(problem("tp3d"), "");
  l.depth = 2, l.micro_batch = 2;
  EXPECT_EQ(problem("tp2p5d"), "tp: micro_batch not divisible by the grid's batch blocks");
  l.micro_batch = 4;
  EXPECT_EQ(problem("tp2p5d"), "");
  // Ulysses, ring and hybrid run beside tensor mode 1d only.
  l.sp = 2;
  EXPECT_EQ(problem("ring"), "sp: ulysses/ring/hybrid need tensor mode 1d");
  l.tp = 1, l.tensor_mode = "1d";
  EXPECT_EQ(problem("ulysses"), "");
  l.sp = 4;
  EXPECT_NE(problem("ulysses"), "");  // 6 heads over 4
  l.seq = 28;
  EXPECT_EQ(problem("ring"), "sp: ring needs seq_len divisible by 2*sp");
  l.seq = 24, l.ulysses = 2;
  EXPECT_EQ(problem("hybrid"), "");  // a = 2 of 6 heads, 24 by r x lcm(2, a) = 4
  l.tp = 5;
  EXPECT_EQ(problem("megatron"), "sp: megatron needs seq_len divisible by tp");
}

}  // namespace
}  // namespace kolos
