// The search: memory pruning and its killer, GPT-3 175B on 1024 A100s, the
// drop accounting, and the parallel.auto check of fixed sizes.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>

#include "kolos/core/error.h"
#include "kolos/planner/search.h"
#include "planner_fixtures.h"

using namespace kolos::planner;

namespace {

Machine a100() {
  const ClusterFile f = load_cluster(KOLOS_SOURCE_DIR "/examples/clusters/a100-80gb-ib.toml");
  return Machine{f.cluster, f.rates};
}

// GPT-3 175B (Brown et al. 2020) with Megatron's vocabulary.
Workload gpt3_175b() {
  Workload w;
  w.model.name = "gpt3-175b";
  w.model.layers = 96, w.model.hidden = 12288, w.model.heads = 96;
  w.model.seq_len = 2048, w.model.vocab = 51200;
  w.global_batch = 1536;
  return w;
}

Workload small() { return fixtures::small_workload(); }

int64_t accounted(const SearchResult& r) {
  int64_t n = r.survived;
  for (const auto& [reason, count] : r.dropped) n += count;
  return n;
}

}  // namespace

TEST(PlannerSearch, A175BModelOnEightGpusHasNoPlanAndSaysWhy) {
  SearchOptions opt;
  opt.ranks = 8;
  const SearchResult r = search(gpt3_175b(), a100(), opt);
  EXPECT_TRUE(r.plans.empty());
  EXPECT_EQ(r.survived, 0);
  EXPECT_GT(r.dropped.at("memory: exceeds device memory"), 0);
  // The last constraint that removed candidates is memory, with the closest one.
  EXPECT_EQ(r.killer.rfind("\"memory: exceeds device memory\" removed the last", 0), 0u)
      << r.killer;
  EXPECT_NE(r.killer.find("the device has 80.0 GiB"), std::string::npos) << r.killer;
  const std::string table = format_plans(r, gpt3_175b(), a100());
  EXPECT_NE(table.find("No plan: "), std::string::npos) << table;
  EXPECT_EQ(accounted(r), r.evaluated);
}

TEST(PlannerSearch, Gpt3On1024A100sKeepsTensorParallelismInsideANode) {
  SearchOptions opt;
  opt.ranks = 1024;
  const Workload w = gpt3_175b();
  const Machine m = a100();
  const SearchResult r = search(w, m, opt);
  std::printf("%s", format_plans(r, w, m).c_str());
  std::printf("search: %lld candidates in %.2f s (not asserted)\n",
              static_cast<long long>(r.evaluated), r.seconds);
  ASSERT_FALSE(r.plans.empty());
  EXPECT_GT(r.evaluated, 0);
  EXPECT_LT(r.evaluated, 100000000);
  EXPECT_EQ(accounted(r), r.evaluated);
  EXPECT_EQ(r.top, 10u);
  EXPECT_LE(r.plans.size(), r.top + opt.layouts);
  for (size_t i = 0; i < 3 && i < r.plans.size(); ++i) {
    const Candidate& c = r.plans[i].candidate;
    EXPECT_LE(c.tp, 8) << c.describe();
    EXPECT_EQ(c.ranks(), 1024);
    EXPECT_LE(r.plans[i].prediction.memory, m.cluster.device_memory);
  }
  for (size_t i = 1; i < r.plans.size(); ++i) {
    // Best first, up to the 1% tie band.
    EXPECT_LE(r.plans[i - 1].prediction.step, r.plans[i].prediction.step * 1.0101);
  }
}

TEST(PlannerSearch, AfterTheTopComesTheBestPlanOfEachOtherLayout) {
  SearchOptions opt;
  opt.ranks = 16;
  opt.top = 3;
  const SearchResult r = search(small(), a100(), opt);
  ASSERT_EQ(r.top, 3u);
  ASSERT_GT(r.plans.size(), r.top) << format_plans(r, small(), a100());
  EXPECT_LE(r.plans.size(), r.top + opt.layouts);
  std::set<std::string> layouts;
  for (size_t i = 0; i < r.top; ++i) layouts.insert(r.plans[i].candidate.layout());
  for (size_t i = r.top; i < r.plans.size(); ++i) {
    // A layout the top lacks, once, after every plan before it.
    EXPECT_TRUE(layouts.insert(r.plans[i].candidate.layout()).second)
        << r.plans[i].candidate.describe();
    EXPECT_LE(r.plans[i - 1].prediction.step, r.plans[i].prediction.step * 1.0101);
  }
  // Each is its layout's best: no plan of the whole search with that
  // layout predicts a faster step.
  opt.top = 100000;
  opt.layouts = 0;
  const SearchResult all = search(small(), a100(), opt);
  for (size_t i = r.top; i < r.plans.size(); ++i) {
    for (const RankedPlan& q : all.plans) {
      if (q.candidate.layout() != r.plans[i].candidate.layout()) continue;
      EXPECT_GE(q.prediction.step, r.plans[i].prediction.step / 1.0101)
          << q.candidate.describe() << " beats " << r.plans[i].candidate.describe();
    }
  }
  const std::string table = format_plans(r, small(), a100());
  EXPECT_NE(table.find("Rows 4-"), std::string::npos) << table;
  EXPECT_NE(r.plans.front().candidate.layout().find("pp "), std::string::npos);
}

TEST(PlannerSearch, DropReasonsCoverEveryCandidate) {
  SearchOptions opt;
  opt.ranks = 16;
  const SearchResult r = search(small(), a100(), opt);
  ASSERT_FALSE(r.plans.empty());
  EXPECT_EQ(accounted(r), r.evaluated);
  // 8 heads cannot split 16 ways; a global batch of 64 cannot split for
  // micro-batch 8 over 16 data ranks.
  EXPECT_GT(r.dropped.at("tp: heads, kv heads or MLP width do not divide by the tensor split"), 0);
  EXPECT_GT(r.dropped.at("batch: global batch not divisible by micro_batch x dp"), 0);
  const std::string table = format_plans(r, small(), a100());
  EXPECT_NE(table.find("| 1 | "), std::string::npos) << table;
  EXPECT_NE(table.find("Dropped:"), std::string::npos) << table;
}

TEST(PlannerSearch, FixedSizesThatNoCandidateSatisfiesAreNamed) {
  SearchOptions opt;
  opt.ranks = 16;
  // A size that fits: every plan has it.
  opt.fixed.tp = 2;
  const SearchResult ok = check_fixed(small(), a100(), opt);
  ASSERT_FALSE(ok.plans.empty());
  for (const RankedPlan& p : ok.plans) EXPECT_EQ(p.candidate.tp, 2);
  // 16 tensor ranks for 9 heads (no mode's split divides 9): named, with the reason.
  Workload odd = small();
  odd.model.heads = 9, odd.model.hidden = 1152;
  opt.fixed.tp = 16;
  try {
    check_fixed(odd, a100(), opt);
    FAIL() << "no error";
  } catch (const kolos::ConfigError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("parallel.tensor.size = 16: parallel.auto = true finds no plan", 0), 0u)
        << message;
    EXPECT_NE(message.find("tp: heads"), std::string::npos) << message;
  }
  // A size that does not divide the ranks.
  opt.fixed.tp = 3;
  try {
    check_fixed(small(), a100(), opt);
    FAIL() << "no error";
  } catch (const kolos::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tensor.size = 3"), std::string::npos);
  }
  // Each fits alone, not together: tp 8 and sp 4 need 32 > 16 ranks.
  opt.fixed.tp = 8;
  opt.fixed.sp = 4;
  try {
    check_fixed(small(), a100(), opt);
    FAIL() << "no error";
  } catch (const kolos::ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("parallel.sequence.size = 4, parallel.tensor.size = 8: each fits "
                           "alone, but no plan has all of them"),
              std::string::npos)
        << message;
  }
}

TEST(PlannerSearch, TheCallersVerdictRemovesPlansAndIsCounted) {
  SearchOptions opt;
  opt.ranks = 16;
  const SearchResult all = search(small(), a100(), opt);
  ASSERT_GE(all.plans.size(), 4u);
  // Refuse the three fastest plans the callback is asked about; amend the
  // others' memory.
  std::vector<std::string> refused;
  opt.accept = [&](const Candidate& c, Prediction& p) -> std::string {
    if (refused.size() < 3) {
      refused.push_back(c.describe());
      return "caller: refused";
    }
    p.memory = 42;
    return "";
  };
  const SearchResult some = search(small(), a100(), opt);
  ASSERT_EQ(refused.size(), 3u);
  ASSERT_FALSE(some.plans.empty());
  for (const RankedPlan& p : some.plans) {
    EXPECT_EQ(p.prediction.memory, 42);
    for (const auto& r : refused) EXPECT_NE(p.candidate.describe(), r);
  }
  // Asked fastest first: the refused are among the best plans without the caller.
  for (const auto& r : refused) {
    bool among = false;
    for (const RankedPlan& p : all.plans) among = among || p.candidate.describe() == r;
    EXPECT_TRUE(among) << r;
  }
  ASSERT_TRUE(some.dropped.count("caller: refused"));
  EXPECT_EQ(some.dropped.at("caller: refused"), 3);
  EXPECT_EQ(some.survived + 3, all.survived);
}
