// The finalists (tune.h): plan families, the margin, the uncertainty, the
// feedback a measured finalist leaves in the calibration, and a tuner that
// picks the truly fastest finalist when the cost model is wrong for one
// family. No timing: "measured" times here are given.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/planner/search.h"
#include "kolos/planner/tune.h"
#include "planner_fixtures.h"

using namespace kolos::planner;

namespace {

Machine test_machine() { return fixtures::test_machine(1); }

Workload small() { return fixtures::small_workload(); }

std::string error_of(const std::string& text) {
  try {
    parse_calibration(text, "cal.toml", {});
  } catch (const kolos::ConfigError& e) {
    return e.what();
  }
  return "";
}

const char* kCalibration =
    "[calibration]\n"           // line 1
    "host = \"h\"\n"            // 2
    "gemm_flops = 1e11\n"       // 3
    "attention_flops = 5e10\n"  // 4
    "elementwise_bytes = 1e10\n";

}  // namespace

TEST(PlannerTune, FamiliesNameTensorSequenceZeroAndSchedule) {
  Candidate c;
  EXPECT_EQ(family_of(c), "tp=none sp=none zero=0 pp=none");
  c.tp = 4, c.tp_mode = "2d", c.zero = 2;
  EXPECT_EQ(family_of(c), "tp=2d sp=none zero=2 pp=none");
  c.tp = 2, c.tp_mode = "1d", c.sp_mode = "megatron";
  EXPECT_EQ(family_of(c), "tp=1d sp=megatron zero=2 pp=none");
  c = Candidate{};
  c.sp = 2, c.sp_mode = "ring", c.pp = 2, c.schedule = Schedule::kInterleaved, c.chunks = 2;
  EXPECT_EQ(family_of(c), "tp=none sp=ring zero=0 pp=interleaved");
  // Sizes, micro-batches and recomputation are not part of the family.
  Candidate d = c;
  d.micro_batch = 8, d.dp = 4, d.recompute = Recompute::kFull;
  EXPECT_EQ(family_of(c), family_of(d));
  std::string why;
  EXPECT_TRUE(valid_family(family_of(c), &why)) << why;
  for (const char* bad :
       {"", "tp=1d", "tp=4d sp=none zero=0 pp=none", "tp=1d sp=none zero=4 pp=none",
        "tp=1d sp=none zero=0 pp=none x", "sp=none tp=1d zero=0 pp=none"}) {
    EXPECT_FALSE(valid_family(bad, &why)) << bad;
    EXPECT_NE(why.find("is not a plan family"), std::string::npos) << why;
  }
}

TEST(PlannerTune, TheBestKAreFinalistsAndSoIsEveryPlanWithinTheMargin) {
  // sigma 2% each: the margin is exp(2 * sqrt(2) * 0.02) - 1 = 5.8%.
  const std::vector<Predicted> p = {{1.00, 0.02}, {1.01, 0.02}, {1.03, 0.02},
                                    {1.05, 0.02}, {1.07, 0.02}, {1.30, 0.02}};
  EXPECT_NEAR(margin_of(p[0], p[1]), std::exp(2 * std::sqrt(2.0) * 0.02) - 1, 1e-12);
  EXPECT_EQ(select_finalists(p, 3), (std::vector<size_t>{0, 1, 2, 3}));  // 1.05 is within 5.8%
  EXPECT_EQ(select_finalists(p, 1), (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(select_finalists(p, 5), (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(select_finalists(p, 10).size(), p.size());  // K beyond the plans: all of them
  // A wider uncertainty widens the margin: 1.07 and, at 10%, 1.30 too.
  std::vector<Predicted> wide = p;
  for (auto& x : wide) x.uncertainty = 0.03;
  EXPECT_EQ(select_finalists(wide, 1), (std::vector<size_t>{0, 1, 2, 3, 4}));
  for (auto& x : wide) x.uncertainty = 0.10;
  EXPECT_EQ(select_finalists(wide, 1).size(), p.size());
  // One uncertain plan alone comes in when its own sigma covers the gap.
  std::vector<Predicted> one = p;
  one[5].uncertainty = 0.15;
  EXPECT_EQ(select_finalists(one, 1), (std::vector<size_t>{0, 1, 2, 3, 5}));
  // The margin is measured from the best prediction wherever it stands.
  // and is tried first.
  const std::vector<Predicted> q = {{1.005, 0.02}, {1.00, 0.02}, {1.2, 0.02}};
  EXPECT_EQ(select_finalists(q, 1), (std::vector<size_t>{1, 0}));
  EXPECT_TRUE(select_finalists({}, 3).empty());
  EXPECT_THROW(select_finalists(p, 0), kolos::Error);
}

TEST(PlannerTune, FinalistsAreTriedOneOfEachLayoutFirst) {
  // Three variants of layout A ahead of B's best and C's: the same set as
  // without layouts, tried as A's best, B's, C's, then A's other variants.
  const std::vector<Predicted> p = {{1.00, 0.02, "A"}, {1.01, 0.02, "A"}, {1.02, 0.02, "A"},
                                    {1.03, 0.02, "B"}, {1.04, 0.02, "B"}, {1.05, 0.02, "C"},
                                    {1.30, 0.02, "D"}};
  EXPECT_EQ(select_finalists(p, 3), (std::vector<size_t>{0, 3, 5, 1, 2, 4}));
  std::vector<Predicted> one = p;
  for (auto& x : one) x.layout.clear();
  EXPECT_EQ(select_finalists(one, 3), (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
  // A layout outside the margin is not a finalist for being another layout.
  EXPECT_EQ(select_finalists({{1.00, 0.02, "A"}, {1.01, 0.02, "A"}, {1.5, 0.02, "B"}}, 2),
            (std::vector<size_t>{0, 1}));
  // Within the first k it is, and it comes second.
  EXPECT_EQ(select_finalists({{1.00, 0.02, "A"}, {1.01, 0.02, "A"}, {1.5, 0.02, "B"}}, 3),
            (std::vector<size_t>{0, 2, 1}));
}

TEST(PlannerTune, TheBestPredictionsZeroStagesAreTriedRightAfterIt) {
  // A at ZeRO-1 first; its ZeRO-0 sibling is A's third variant, behind B:
  // tried second, before B's best, and A's other variants after. The last
  // sibling, 30% behind, is outside the margin and stays out.
  const std::vector<Predicted> p = {
      {1.00, 0.02, "A", "A mb 4 zero*"}, {1.01, 0.02, "A", "A mb 2 zero*"},
      {1.02, 0.02, "B", "B mb 4 zero*"}, {1.03, 0.02, "A", "A mb 4 zero*"},
      {1.04, 0.02, "C", "C mb 4 zero*"}, {1.30, 0.02, "A", "A mb 4 zero*"}};
  EXPECT_EQ(select_finalists(p, 3), (std::vector<size_t>{0, 3, 2, 4, 1}));
  // Wherever the best stands; another plan's siblings wait their turn.
  EXPECT_EQ(select_finalists({p[1], p[0], p[2], p[3]}, 1), (std::vector<size_t>{1, 3, 2, 0}));
  // Without siblings, the order of layouts.
  std::vector<Predicted> none = p;
  for (auto& x : none) x.sibling.clear();
  EXPECT_EQ(select_finalists(none, 3), (std::vector<size_t>{0, 2, 4, 1, 3}));

  Candidate c;
  c.dp = 4, c.micro_batch = 4, c.zero = 1;
  Candidate d = c;
  d.zero = 3;
  EXPECT_EQ(zero_sibling(c), zero_sibling(d));
  EXPECT_NE(zero_sibling(c).find("zero*"), std::string::npos) << zero_sibling(c);
  d.micro_batch = 2;
  EXPECT_NE(zero_sibling(c), zero_sibling(d));
}

TEST(PlannerTune, PlainDataParallelismIsTriedRightAfterTheBestsZeroStages) {
  // P (a pipeline layout) at ZeRO-1 first, its ZeRO-0 sibling, then three
  // other layouts ahead of plain data parallelism D, whose best variant
  // is tried third: before B and C, ahead of its own second variant.
  const std::vector<Predicted> p = {
      {1.00, 0.02, "P", "P mb 8 zero*"},       {1.01, 0.02, "P", "P mb 8 zero*"},
      {1.02, 0.02, "B", "B mb 8 zero*"},       {1.03, 0.02, "C", "C mb 8 zero*"},
      {1.04, 0.02, "D", "D mb 4 zero*", true}, {1.05, 0.02, "D", "D mb 2 zero*", true},
      {1.60, 0.02, "E", "E mb 4 zero*"}};
  EXPECT_EQ(select_finalists(p, 3), (std::vector<size_t>{0, 1, 4, 2, 3, 5}));
  // Not marked, D waits for the layouts predicted ahead of it.
  std::vector<Predicted> unmarked = p;
  for (auto& x : unmarked) x.data_parallel = false;
  EXPECT_EQ(select_finalists(unmarked, 3), (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
  // Outside the margin it stays out, marked or not.
  std::vector<Predicted> far = p;
  far[4].step = far[5].step = 1.6;
  EXPECT_EQ(select_finalists(far, 3), (std::vector<size_t>{0, 1, 2, 3}));
  // The best itself plain data parallel: the order of layouts after its
  // siblings, as without the mark.
  std::vector<Predicted> best = p;
  best[0].data_parallel = best[1].data_parallel = true;
  best[4].data_parallel = best[5].data_parallel = false;
  EXPECT_EQ(select_finalists(best, 3), (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
}

TEST(PlannerTune, FeedbackIsTheGeometricMeanOfTheLastRatiosWeighedByTheirNumber) {
  MachineRates r;
  const std::string f = "tp=none sp=none zero=3 pp=none";
  EXPECT_DOUBLE_EQ(feedback_factor(r, f), 1.0);
  add_feedback(r, f, 16.0);  // one ratio: a quarter of the way, 16^(1/4)
  EXPECT_NEAR(feedback_factor(r, f), 2.0, 1e-12);
  add_feedback(r, f, 1.0 / 64);  // their mean is 1/2, two fifths of the way
  EXPECT_NEAR(feedback_factor(r, f), std::pow(0.5, 2.0 / 5.0), 1e-12);
  r.feedback.clear();
  add_feedback(r, f, 2.0);
  add_feedback(r, f, 0.5);
  EXPECT_NEAR(feedback_factor(r, f), 1.0, 1e-12);
  add_feedback(r, f, 4.0);  // the geometric mean cbrt(4), half of the way
  EXPECT_NEAR(feedback_factor(r, f), std::pow(4.0, 1.0 / 6.0), 1e-12);
  EXPECT_DOUBLE_EQ(feedback_factor(r, "tp=1d sp=none zero=0 pp=none"), 1.0);
  for (int i = 0; i < 20; ++i) add_feedback(r, f, 1.25);
  EXPECT_EQ(r.feedback.at(f).size(), kFeedbackKept);  // the oldest dropped
  EXPECT_NEAR(feedback_factor(r, f), std::pow(1.25, 8.0 / 11.0), 1e-12);
  EXPECT_THROW(add_feedback(r, f, 0.0), kolos::ConfigError);
  EXPECT_THROW(add_feedback(r, f, std::nan("")), kolos::ConfigError);
  EXPECT_THROW(add_feedback(r, "tp=9d", 1.0), kolos::ConfigError);
}

TEST(PlannerTune, ATuningsRatiosAreRecordedRelativeToTheirMedian) {
  // A lone ratio has nothing to be compared with.
  EXPECT_TRUE(relative_to_median({}).empty());
  EXPECT_TRUE(relative_to_median({1.3}).empty());
  // Odd count: the middle one; the order is kept.
  const std::vector<double> odd = relative_to_median({1.5, 1.2, 1.25});
  ASSERT_EQ(odd.size(), 3u);
  EXPECT_NEAR(odd[0], 1.5 / 1.25, 1e-12);
  EXPECT_NEAR(odd[1], 1.2 / 1.25, 1e-12);
  EXPECT_NEAR(odd[2], 1.0, 1e-12);
  // Even count: the geometric mean of the two middle ones.
  const std::vector<double> even = relative_to_median({2.0, 1.0, 4.0, 0.5});
  ASSERT_EQ(even.size(), 4u);
  EXPECT_NEAR(even[0], std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(even[1], 1 / std::sqrt(2.0), 1e-12);
  // A slow spell that moved every finalist by 1.3 leaves the same ratios.
  const std::vector<double> slow = relative_to_median({1.3 * 1.5, 1.3 * 1.2, 1.3 * 1.25});
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(slow[i], odd[i], 1e-12);
}

TEST(PlannerTune, UncertaintyComesFromTheCalibrationsSpreadAndTheFeedback) {
  MachineRates r;
  const std::string a = "tp=none sp=none zero=0 pp=none", b = "tp=2d sp=none zero=0 pp=none",
                    c = "tp=none sp=ring zero=0 pp=none";
  EXPECT_DOUBLE_EQ(uncertainty(r, a), kMinSpread);  // nothing measured: the floor
  r.spread = 0.04;
  EXPECT_DOUBLE_EQ(uncertainty(r, a), 0.04);
  // One ratio of b: an unmeasured family is as uncertain as the model's miss
  // (|ln 1.5|); b itself is corrected, and one ratio has no scatter: the floor.
  add_feedback(r, b, 1.5);
  EXPECT_NEAR(uncertainty(r, a), std::log(1.5), 1e-12);
  EXPECT_DOUBLE_EQ(uncertainty(r, b), 0.04);
  // Two close ratios: b is known to within their scatter (floored).
  add_feedback(r, b, 1.52);
  EXPECT_DOUBLE_EQ(uncertainty(r, b), 0.04);
  add_feedback(r, b, 2.0);
  const double l[3] = {std::log(1.5), std::log(1.52), std::log(2.0)};
  const double m = (l[0] + l[1] + l[2]) / 3;
  const double sd =
      std::sqrt((std::pow(l[0] - m, 2) + std::pow(l[1] - m, 2) + std::pow(l[2] - m, 2)) / 2);
  EXPECT_NEAR(uncertainty(r, b), sd, 1e-12);
  EXPECT_NEAR(uncertainty(r, a), std::fabs(m), 1e-12);  // the miss is b's mean now
  // A family with one ratio takes the scatter pooled over the others (b's).
  add_feedback(r, c, 0.9);
  EXPECT_NEAR(uncertainty(r, c), sd, 1e-12);
  // Unmeasured: the root mean square of the families' mean misses.
  EXPECT_NEAR(uncertainty(r, a), std::sqrt((m * m + std::log(0.9) * std::log(0.9)) / 2), 1e-12);
}

TEST(PlannerTune, PredictionsOfAFamilyWithFeedbackAreScaledAndCarryTheirUncertainty) {
  const Workload w = small();
  Machine m = test_machine();
  Candidate dp;
  dp.dp = 8, dp.microbatches = 2, dp.micro_batch = 4;
  Candidate z3 = dp;
  z3.zero = 3;
  const Prediction before = predict(w, m, z3), other_before = predict(w, m, dp);
  EXPECT_DOUBLE_EQ(before.feedback, 1.0);
  EXPECT_DOUBLE_EQ(before.uncertainty, kMinSpread);
  add_feedback(m.rates, family_of(z3), 1.4);
  const Prediction after = predict(w, m, z3), other_after = predict(w, m, dp);
  const double factor = std::pow(1.4, 1 / (1 + kFeedbackPrior));  // one ratio against the model
  EXPECT_NEAR(after.feedback, factor, 1e-12);
  EXPECT_NEAR(after.step, factor * before.step, 1e-12 * before.step);
  EXPECT_NEAR(after.compute + after.comm + after.bubble + after.optimizer + after.offload,
              after.step, 1e-9 * after.step);
  // Another family keeps its step; its uncertainty grows (the model missed
  // ZeRO-3 by 40%).
  EXPECT_DOUBLE_EQ(other_after.step, other_before.step);
  EXPECT_NEAR(other_after.uncertainty, std::log(1.4), 1e-12);
}

TEST(PlannerTune, CalibrationFilesKeepSpreadAndFeedback) {
  MachineRates r = parse_calibration(kCalibration, "cal.toml", {});
  r.spread = 0.031;
  add_feedback(r, "tp=2d sp=none zero=0 pp=none", 1.75);
  add_feedback(r, "tp=2d sp=none zero=0 pp=none", 1.5);
  add_feedback(r, "tp=none sp=none zero=2 pp=gpipe", 0.9);
  const MachineRates back = parse_calibration(format_calibration("h", r), "again.toml", {});
  EXPECT_DOUBLE_EQ(back.spread, 0.031);
  EXPECT_EQ(back.feedback, r.feedback);
  // Errors name the file, the line and the field.
  const std::string base = kCalibration;
  EXPECT_EQ(error_of(base + "spread = -1\n")
                .rfind("cal.toml:6: calibration.spread: -1 is out of range", 0),
            0u)
      << error_of(base + "spread = -1\n");
  std::string e = error_of(base + "[[calibration.feedback]]\nfamily = \"tp=7d\"\nratios = [1.0]\n");
  EXPECT_EQ(e.rfind("cal.toml:7: calibration.feedback.family: \"tp=7d\" is not a plan family", 0),
            0u)
      << e;
  e = error_of(base +
               "[[calibration.feedback]]\nfamily = \"tp=none sp=none zero=0 pp=none\"\nratios = "
               "[1.0, -2]\n");
  EXPECT_NE(e.find("cal.toml:8: calibration.feedback.ratios: -2 is not a ratio"), std::string::npos)
      << e;
  e = error_of(base + "[[calibration.feedback]]\nfamily = \"tp=none sp=none zero=0 pp=none\"\n");
  EXPECT_NE(e.find("has no `ratios`"), std::string::npos) << e;
  e = error_of(base + "[[calibration.feedback]]\nfamily = \"tp=none sp=none zero=0 pp=none\"\n" +
               "ratios = [1.0]\n[[calibration.feedback]]\nfamily = \"tp=none sp=none zero=0 "
               "pp=none\"\nratios = [1.0]\n");
  EXPECT_NE(e.find("has a row already"), std::string::npos) << e;
}

TEST(PlannerTune, FastestIgnoresSkippedFinalists) {
  EXPECT_EQ(fastest({}), -1);
  EXPECT_EQ(fastest({{0, "skipped: does not fit"}}), -1);
  EXPECT_EQ(fastest({{0.9, ""}, {0.1, "skipped: x"}, {0.7, ""}, {0.8, ""}}), 2);
}

// The tuner's loop on a cost model that is wrong for one family: a
// test-only feedback row claims that family X (one whose plans are truly
// slower than the best) runs at a fraction of the model's time, so X's plans
// top the ranking. "The truth", what a trial run would measure, is the model
// without that row. Each round: search, select the finalists, "measure" them,
// pick the fastest, feed the ratios back. Every round picks the truly fastest
// finalist, and the feedback brings the ranking back to the truth.
TEST(PlannerTune, TheTunerPicksTheTrulyFastestWhenOneFamilyIsMispredicted) {
  const Workload w = small();
  const Machine truth = test_machine();
  SearchOptions opt;
  opt.ranks = 8;
  opt.top = 20;
  opt.offload_fractions = {0.0};
  // A small search: dp, tensor 1d and the pipeline's schedules.
  opt.fixed.sp = 1, opt.fixed.zero = 0, opt.fixed.micro_batch = 4, opt.fixed.recompute = "none";
  const SearchResult honest = search(w, truth, opt);
  ASSERT_GE(honest.plans.size(), 10u);
  const double best_true = honest.plans.front().prediction.step;
  // X: a family whose every plan is truly at least 20% slower than the best.
  std::map<std::string, double> fastest_of;
  for (const auto& rp : honest.plans) {
    const std::string f = family_of(rp.candidate);
    if (!fastest_of.count(f) || rp.prediction.step < fastest_of[f])
      fastest_of[f] = rp.prediction.step;
  }
  std::string x;
  double x_true = 0;
  for (const auto& [f, step] : fastest_of) {
    if (step >= 1.2 * best_true && (x.empty() || step < x_true)) x = f, x_true = step;
  }
  ASSERT_FALSE(x.empty());
  Machine wrong = truth;
  // X predicted 20% faster than the best: one ratio that, weighed against
  // the model (feedback_factor), gives that factor.
  wrong.rates.feedback[x] = {std::pow(0.8 * best_true / x_true, 1 + kFeedbackPrior)};
  const auto true_step = [&](const Candidate& c) { return predict(w, truth, c).step; };
  bool converged = false;
  for (int round = 0; round < 8 && !converged; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const SearchResult planned = search(w, wrong, opt);
    ASSERT_FALSE(planned.plans.empty());
    if (round == 0) EXPECT_EQ(family_of(planned.plans.front().candidate), x);
    converged = family_of(planned.plans.front().candidate) != x;
    std::vector<Predicted> predicted;
    for (const auto& rp : planned.plans)
      predicted.push_back({rp.prediction.step, rp.prediction.uncertainty});
    const std::vector<size_t> finalists = select_finalists(predicted, 3);
    std::vector<Trial> trials;
    size_t truly_fastest = 0;
    for (const size_t i : finalists) {
      trials.push_back({true_step(planned.plans[i].candidate), ""});
      if (trials.back().measured < trials[truly_fastest].measured)
        truly_fastest = trials.size() - 1;
    }
    const int64_t pick = fastest(trials);
    ASSERT_GE(pick, 0);
    EXPECT_EQ(static_cast<size_t>(pick), truly_fastest);
    const Candidate& chosen = planned.plans[finalists[static_cast<size_t>(pick)]].candidate;
    // The pick is never the mispredicted family (its plans are truly >= 20%
    // slower than the best, which the finalists hold from round 0 on).
    EXPECT_NE(family_of(chosen), x) << chosen.describe();
    EXPECT_LE(trials[static_cast<size_t>(pick)].measured, 1.2 * best_true);
    // Feedback: each measured finalist's measured / model ratio, over the
    // median of this round's (as the autoplan plugin records them).
    std::vector<double> ratios;
    for (size_t k = 0; k < finalists.size(); ++k) {
      const RankedPlan& rp = planned.plans[finalists[k]];
      ratios.push_back(trials[k].measured / (rp.prediction.step / rp.prediction.feedback));
    }
    const std::vector<double> relative = relative_to_median(ratios);
    ASSERT_EQ(relative.size(), finalists.size());
    for (size_t k = 0; k < finalists.size(); ++k) {
      add_feedback(wrong.rates, family_of(planned.plans[finalists[k]].candidate), relative[k]);
    }
  }
  EXPECT_TRUE(converged) << "X still ranks first after 8 rounds of feedback";
}
