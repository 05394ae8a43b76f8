// A layers plugin that exists only in this test, registered the way a new
// plugin folder registers its terms (KOLOS_PLUGIN_TERMS): the planner offers
// its layout, prices the collectives it says it issues, and names its family,
// with no change to planner/. The planner knows no plugin by name.
#include <gtest/gtest.h>

#include <algorithm>

#include "kolos/core/plugin_terms.h"
#include "kolos/planner/search.h"
#include "kolos/planner/tune.h"
#include "planner_fixtures.h"

using namespace kolos;
using namespace kolos::planner;

namespace {

// The bytes of the test plugin's one forward all-reduce per block.
double g_block_bytes = 64.0 * 1024 * 1024;

// Offered on exactly two tensor ranks, as tensor mode "x" (choose_plugins
// names its plugin "tpx").
void x_layouts(const LayoutQuery& mesh, std::vector<LayoutQuery>& out) {
  if (mesh.tp != 2) return;
  LayoutQuery l = mesh;
  l.tensor_mode = "x", l.depth = 1;
  out.push_back(l);
}

void x_traffic(const MemoryQuery& q, std::vector<CollectiveCall>& out) {
  CollectiveCall c;
  c.op = Collective::kAllReduce, c.bytes = g_block_bytes, c.n = q.tp, c.stride = 1;
  out.push_back(c);
}

PluginTerms x_terms() {
  PluginTerms t;
  t.name = "tpx", t.role = "layers", t.mode = "x";
  t.cut = [](const MemoryQuery& q) {
    const double tp = static_cast<double>(q.tp);
    return TensorCut{tp, tp, tp};
  };
  t.layouts = x_layouts;
  t.traffic = x_traffic;
  return t;
}

KOLOS_PLUGIN_TERMS(x_terms());

// A layers plugin whose terms say nothing of its traffic (tensor mode "y").
KOLOS_PLUGIN_TERMS(PluginTerms{"tpy", "layers"});

}  // namespace

TEST(PlannerPluginCosts, ARegisteredLayersPluginIsOfferedPricedAndNamed) {
  const Workload w = fixtures::small_workload();
  const Machine mach = fixtures::test_machine(1);
  SearchOptions opt;
  opt.ranks = 4;
  opt.top = 100000;
  opt.fixed.tp = 2;
  opt.fixed.tp_mode = "x";
  const SearchResult r = search(w, mach, opt);
  ASSERT_FALSE(r.plans.empty()) << r.killer;
  for (const RankedPlan& p : r.plans) EXPECT_EQ(p.candidate.tp_mode, "x");
  Candidate c = r.plans.front().candidate;
  EXPECT_EQ(plugins_of(c).layers, "tpx");
  EXPECT_EQ(family_of(c).rfind("tp=x ", 0), 0u) << family_of(c);
  std::string why;
  EXPECT_TRUE(valid_family("tp=x sp=none zero=0 pp=none", &why)) << why;

  // The bytes it says it sends, per block and micro-batch, on every block
  // of the rank; doubling them doubles the tensor traffic and lengthens
  // the step by the all-reduce's time.
  c.pp = 1, c.recompute = Recompute::kNone;
  const Prediction once = predict(w, mach, c);
  const double sent = 2.0 * (2 - 1) / 2 * g_block_bytes;
  EXPECT_DOUBLE_EQ(once.bytes_tp, static_cast<double>(c.microbatches) *
                                      static_cast<double>(w.model.layers) * sent);
  g_block_bytes *= 2;
  const Prediction twice = predict(w, mach, c);
  g_block_bytes /= 2;
  EXPECT_DOUBLE_EQ(twice.bytes_tp, 2 * once.bytes_tp);
  EXPECT_GT(twice.comm, once.comm);
  EXPECT_GT(twice.step, once.step);
}

// A plugin that does not say what it sends is named in the prediction and
// in the plan table, not priced as another.
TEST(PlannerPluginCosts, APluginWithoutTrafficIsNamedNotGuessed) {
  const Workload w = fixtures::small_workload();
  const Machine mach = fixtures::test_machine(1);
  Candidate c;
  c.dp = 2, c.tp = 2, c.tp_mode = "y", c.microbatches = 32, c.micro_batch = 1;
  const Prediction p = predict(w, mach, c);
  ASSERT_EQ(p.unpriced.size(), 1u);
  EXPECT_EQ(p.unpriced[0],
            "layers plugin `tpy` says nothing of what it sends: its traffic is "
            "not priced");
  EXPECT_EQ(p.bytes_tp, 0);
  SearchResult r;
  r.plans.push_back({c, p});
  r.top = 1;
  EXPECT_NE(format_plans(r, w, mach).find("Not priced: layers plugin `tpy`"), std::string::npos);
  c.tp_mode = "x";
  EXPECT_TRUE(predict(w, mach, c).unpriced.empty());
}

// Every shipped plugin the planner can offer also says what it sends, and
// every gradients plugin what it reduces: none is priced at zero traffic by
// omission.
TEST(PlannerPluginCosts, EveryOfferedPluginPricesItsTraffic) {
  int offered = 0, gradients = 0;
  for (const std::string& name : plugin_terms_names()) {
    const PluginTerms* t = plugin_terms(name);
    if (t->layouts != nullptr) {
      ++offered;
      EXPECT_NE(t->traffic, nullptr) << name;
      EXPECT_FALSE(t->mode.empty()) << name;
    }
    if (t->role == "gradients" && t->states != nullptr) {
      ++gradients;
      EXPECT_NE(t->gradient_traffic, nullptr) << name;
    }
  }
  // tp1d, tp2d, tp2p5d, tp3d, ulysses, ring, hybrid, megatron, and this
  // test's tpx; dp, zero1-3.
  EXPECT_EQ(offered, 9);
  EXPECT_EQ(gradients, 4);
}

// The sequence plugins' layouts for sp = 4 beside a 1d tensor group:
// ulysses, ring, and hybrid with a = 2; megatron only at sp = 1.
TEST(PlannerPluginCosts, SequenceLayoutsComeFromThePlugins) {
  LayoutQuery mesh;
  mesh.tp = 2, mesh.sp = 4, mesh.tensor_mode = "1d";
  std::vector<std::string> words;
  for (const LayoutQuery& l : offered_layouts("sequence", mesh)) {
    words.push_back(l.sequence_mode + (l.ulysses > 1 ? std::to_string(l.ulysses) : ""));
  }
  EXPECT_EQ(words, (std::vector<std::string>{"hybrid2", "ring", "ulysses"}));
  mesh.sp = 1;
  words.clear();
  for (const LayoutQuery& l : offered_layouts("sequence", mesh)) words.push_back(l.sequence_mode);
  EXPECT_EQ(words, (std::vector<std::string>{"megatron"}));
}
