// The planner's finalists, tried for a few steps inside the job before it
// trains (`parallel.auto = true` in `kolos train`, `kolos plan --tune K`;
// docs/planner.md, "Finalists").
//
// Protocol (collective over the world, every rank in the same order):
//   1. rank 0 searches (Planner::plan); its finalists, with their overrides
//      and predictions, are broadcast as text, so every rank tries the same
//      list;
//   2. for each finalist, best prediction first: whether the tuning's time
//      bound leaves room for it is rank 0's decision, broadcast; every rank
//      loads the config with the finalist's overrides (train.steps = the
//      tune's steps, no metrics file, no progress, no checkpoint) and the
//      load's errors are agreed; then an Engine trains it. An error the
//      engine's set-up agrees on (a layout that does not fit, a refused mix)
//      skips the finalist on every rank with its reason; any other error
//      ends the job, as in any run;
//   3. a finalist's time is the median of its steps after the warm-up, the
//      slowest rank's (an all-reduce), so every rank holds the same figures;
//      the first pass takes at most 75% of the time bound while finalists
//      are left; then those within 10% of the fastest run a second time, in
//      the reverse order, and keep the faster of their two figures; then
//      the finalists the first pass left, bound permitting;
//   4. rank 0 picks the fastest measured and records the measured/predicted
//      ratios (Planner::record_trials); the caller broadcasts the choice.
//
// Test hooks, only in the test copy of libkolos_tune (lib/faults of the
// build tree, built with KOLOS_FAULT_INJECTION; the installed library has
// none): KOLOS_TEST_TUNE_STEP_S = "PATTERN=SECONDS;..." replaces the
// measured time of a finalist whose description contains PATTERN (the
// first match) once it has run, so that a test knows which finalist is
// truly fastest without timing anything; KOLOS_TEST_TUNE_FAIL = PATTERN
// makes the set-up of such a finalist fail on the last rank only, which
// every rank must agree on; KOLOS_TEST_TUNE_WALL_S = SECONDS makes each
// finalist run last that long on the tuning's clock (where the bound falls).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolos/core/planner.h"
#include "kolos/core/runtime.h"

namespace kolos::cli {

struct Tuned {
  PlanReport report;                // rank 0's (empty elsewhere)
  std::vector<TrialResult> trials;  // every rank: one per finalist tried or not
  int64_t pick = -1;                // index into trials; -1: none measured
  double seconds = 0;               // the tuning's wall time (rank 0's)
  std::string recorded;             // rank 0: the calibration file the ratios went to
  // What to train, on every rank: the pick, else the best prediction.
  PlannedRun chosen;
};

// Collective: rank 0 plans with `planner`, every rank tries the finalists
// of config file `path` with `overrides` (the config's own), rank 0 picks
// and records. Errors of the search are agreed (AgreedError on every rank).
// With fewer than two finalists nothing is tried.
Tuned plan_and_tune(const Runtime& runtime, Planner& planner, const RunConfig& config,
                    const std::string& path, const std::vector<std::string>& overrides);

// `kolos plan --tune K` on one of the N ranks mpirun starts: loads the
// config, plan_and_tune, and rank 0 prints the plans, the finalists' table
// and the pick (with `json`: the plans' JSON with "tuning" and "chosen").
using PlannerFactory = std::function<std::shared_ptr<Planner>(const RunConfig&)>;
int plan_tune_worker(int argc, char** argv, const std::string& config_path,
                     const std::vector<std::string>& overrides, bool json,
                     const PlannerFactory& make_planner);

// The median of `times` after the first `skip` (a run's steps after its
// warm-up), 0 when none is left: a finalist's figure and a calibration
// reference's.
double steady_median(std::vector<double> times, size_t skip);

// Rank 0's `text` on every rank of the world (collective).
std::string broadcast_text(std::string text);

// One rank of a planner's job (`kolos calibrate --worker`, `kolos plan
// --tune`): the process on kolos's training heap (malloc_tuning.h; it may
// restart once), MPI started, the stop handlers installed, and on every rank
// the built-in models registered, config file `path` loaded with
// `overrides` and its planner made, the errors agreed (AgreedError on
// every rank); then `body`, under run_guarded (its exit code).
using PlannerBody = std::function<int(const Runtime&, Planner&, const RunConfig&)>;
int planner_worker(int argc, char** argv, const std::string& path,
                   const std::vector<std::string>& overrides, const PlannerFactory& make_planner,
                   const PlannerBody& body);

// The finalists' table and the pick, for the log ("kolos: PREFIX: ..." lines).
std::string format_trials(const Tuned& tuned, const std::string& prefix);
// The same as a JSON object: {"finalists":[...],"pick":...,"seconds":...}.
std::string trials_json(const Tuned& tuned);

}  // namespace kolos::cli
