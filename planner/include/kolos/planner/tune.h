// Trying the best predictions before training: which plans are finalists,
// how uncertain a prediction is, and what measured finalists teach the cost
// model (docs/planner.md, "Finalists").
//
// The cost model ranks plans by a prediction that is off by several percent
// on a shared machine, and picking the minimum of noisy predictions selects
// the plan whose error flatters it most. So `parallel.auto` (and `kolos plan
// --tune K`) runs a few finalists for a few steps and trains the fastest
// measured. The finalists are the best K predictions and every other plan
// whose prediction is within the margin of the best one:
//
//   ln(step_i / step_best) <= kMarginSigmas * sqrt(sigma_best^2 + sigma_i^2)
//
// where sigma is a prediction's relative uncertainty (uncertainty() below).
//
// Feedback: each measured finalist's ratio measured / model (the model's
// prediction without feedback), relative to the median of its tuning's
// ratios (relative_to_median), is recorded per plan family (tensor mode,
// sequence mode, ZeRO stage, pipeline schedule) into the calibration in use
// ([[calibration.feedback]]); later predictions on this host multiply a
// family's step by the geometric mean of its ratios, weighed against the
// model by their number (feedback_factor), and the ratios' spread sets the
// family's uncertainty. Torch-free, no MPI: the trial runs
// themselves are the caller's (kolos train, kolos plan --tune).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/planner/candidate.h"
#include "kolos/planner/cluster.h"

namespace kolos::planner {

// The margin in combined standard deviations (two: a plan outside it is
// faster than the best prediction with a probability of about 2%, if the
// errors are normal in the logarithm).
inline constexpr double kMarginSigmas = 2.0;
// The least relative uncertainty of a prediction, whatever the calibration
// measured: the step-to-step noise of a run on a shared machine.
inline constexpr double kMinSpread = 0.02;
// Ratios kept per family (the most recent; older ones are dropped so that
// the feedback follows the machine).
inline constexpr size_t kFeedbackKept = 8;

// The family a plan's feedback is kept under: "tp=1d sp=ring zero=2
// pp=1f1b", with "none" for an axis of size 1 (tp, pp) or no sequence mode.
std::string family_of(const Candidate& c);
// Whether `text` is a family as family_of writes it (the calibration file's
// check). Sets `why` when it is not.
bool valid_family(const std::string& text, std::string* why);

// How many ratios a family's feedback weighs against the model: the
// factor is the geometric mean of its n ratios raised to n / (n +
// kFeedbackPrior), so one ratio moves a prediction a quarter of the way
// (in the logarithm) and eight ratios about three quarters. A finalist's
// trial is a few steps on a shared machine, as noisy as the model's own
// error for a family; taken whole, one tuning's ratios made the
// predictions of sixteen saved planner checks rank the plans worse than
// the model alone (Spearman >= 0.85 in 9 of them against 12), and
// weighed this way they cost nothing there (12 of 16;
// bench/planner/feedback_rules.py, docs/planner.md "Finalists"). As
// trials agree, the model gives way.
inline constexpr double kFeedbackPrior = 3.0;

// The factor a family's feedback applies to the model's step: the geometric
// mean of its n ratios to the power n / (n + kFeedbackPrior); 1 without
// feedback.
double feedback_factor(const MachineRates& rates, const std::string& family);
// The relative uncertainty (one standard deviation, of ln measured/predicted)
// of a prediction for `family`, never below the calibration's spread (and
// kMinSpread): for a family with feedback, the scatter of its ratios (with
// one ratio, the scatter pooled over the families that have two or more);
// for a family without, the root mean square of the other families' mean
// ln ratios (how far the uncorrected model missed on this host).
double uncertainty(const MachineRates& rates, const std::string& family);
// One tuning's ratios measured/model, each divided by their median (the
// geometric mean of the two middle ones for an even count), in the same
// order: what sets each finalist's family apart from the others measured
// in the same job. A slow or fast spell of the machine during the tuning
// moves every ratio alike and cancels; how fast the machine is overall
// stays the calibration's reference runs' to say. Fewer than two ratios:
// none back (a lone finalist has nothing to be compared with).
std::vector<double> relative_to_median(const std::vector<double>& ratios);
// Records one measured/model ratio for `family` (keeps the last kFeedbackKept).
// Throws ConfigError for a ratio that is not a positive finite number.
void add_feedback(MachineRates& rates, const std::string& family, double ratio);

// A plan as the finalist selection sees it.
struct Predicted {
  double step = 0;         // predicted seconds per step
  double uncertainty = 0;  // relative, one standard deviation
  std::string layout;      // Candidate::layout(); plans of one layout share their errors
  // The plan but its ZeRO stage (zero_sibling below): plans that differ
  // only in it share this; empty: none.
  std::string sibling;
  // Plain data parallelism: every axis but the data axis of size 1. The
  // layout a person runs without a planner, and the one the calibration's
  // reference runs measured.
  bool data_parallel = false;
};

// A plan's description with its ZeRO stage left out: the same text for the
// plans that differ in nothing else.
std::string zero_sibling(const Candidate& c);
// The finalists among `plans` (best predictions first, as the search ranks
// them): the first `k` and every other whose prediction lies within the
// margin of the best one (above). In the order they are tried (a time bound
// may stop the tuning before the last): the best prediction, then its ZeRO
// siblings among the finalists (the same plan at another ZeRO stage), then
// the best plain data-parallel finalist, then the best finalist of each
// other layout, then the rest in the order of `plans`. A layout's variants
// (schedule, micro-batching, ZeRO stage) share most of a prediction's
// error, so one of each is worth more than a second of one; except the
// best's ZeRO stages, which differ in the model's least sure terms (the
// copies and collectives of sharding, small against the step), so that
// whichever the model put first, the pick is between them as measured.
// Plain data parallelism comes next because it is what a person runs
// without a planner: once measured, the pick is never slower than it as
// the tuning measured them. k >= 1.
std::vector<size_t> select_finalists(const std::vector<Predicted>& plans, int64_t k,
                                     double sigmas = kMarginSigmas);
// The margin of plan i over the best: kMarginSigmas * the combined sigma,
// as a relative step (exp(...) - 1), for the log.
double margin_of(const Predicted& best, const Predicted& plan, double sigmas = kMarginSigmas);

// A finalist's trial: measured seconds per step (> 0), or why it was skipped.
struct Trial {
  double measured = 0;
  std::string skipped;  // empty: measured
};
// The index of the fastest measured trial; -1 when none was measured.
int64_t fastest(const std::vector<Trial>& trials);

}  // namespace kolos::planner
