// The planner role: chooses the mesh and modes of a run from a cost model
// (docs/planner.md). `kolos plan CONFIG -n N` prints its choices;
// `parallel.auto = true` makes `kolos train` run the best one.
//
// A planner plans for this machine, measured by calibrate() (every rank at
// once, as the run will load it; cached per host and rank count), or for
// the machines a cluster file describes ([planner] cluster). Each plan is a
// list of `--set` overrides that turn the config into that run; a plan is
// offered only when kolos accepts the run it makes (plan_run), so every
// plan is a mix kolos runs and tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/roles.h"

namespace kolos {

struct PlannedRun {
  std::vector<std::string> overrides;  // "parallel.tensor.size=2", ...
  std::string describe;                // "pp 1 dp 2 tp 2(1d) mb 2 zero0 none"
  double step_s = 0;                   // predicted seconds per optimizer step
  double memory_bytes = 0;             // predicted peak per rank
  double bytes_per_step = 0;           // sent by one rank per step
  double uncertainty = 0;              // of step_s: relative, one standard deviation
  std::string family;                  // its feedback family: "tp=1d sp=none zero=2 pp=gpipe"
  double model_step_s = 0;             // step_s before this host's measured feedback
};

// How the finalists are tried before training (the planner's keys).
struct TuneSettings {
  int64_t steps = 5;     // steps each finalist runs
  int64_t warmup = 2;    // of which the first are not timed
  double budget_s = 45;  // no finalist starts once the tuning has taken this long
};

// One finalist tried for a few steps (in the same job, nothing saved).
struct TrialResult {
  PlannedRun plan;
  double measured_s = 0;  // median step after the warm-up, the slowest rank's; 0 when skipped
                          // (the faster of two passes for a finalist close to the fastest)
  int passes = 0;         // the runs measured: 0 (skipped), 1, or 2
  std::string skipped;    // why it was not measured ("" when it was)
};

struct PlanReport {
  std::vector<PlannedRun> plans;  // best first
  std::string machine;            // what it planned for: "this machine (calibration FILE)", ...
  std::string text;               // the table and the drop reasons, for people
  std::string json;               // the same as one JSON object
  // The plans to try before training (indices into plans, best prediction
  // first); empty: train the best prediction as it is.
  std::vector<size_t> finalists;
  std::string finalist_rule;  // how they were chosen, for the log
  TuneSettings tune;
};

class Planner : public RolePlugin {
 public:
  // The calibration file for `ranks` ranks on this host, and whether the
  // plan needs one (false when [planner] cluster gives every rate).
  virtual std::string calibration_path(int64_t ranks) const = 0;
  virtual bool needs_calibration() const = 0;
  // What can be checked before any measurement: that the cost model
  // describes the config's model, and the cluster file when one is set.
  // Throws ConfigError.
  virtual void check(const RunConfig& config) const = 0;
  // Collective over `world`: measures compute rates with every rank busy at
  // once and the collectives of every group size, for `config`'s model
  // shape; rank 0 writes calibration_path(world size). Returns that path.
  virtual std::string calibrate(const comm::ProcessGroupPtr& world, const RunConfig& config) = 0;
  // On rank 0 after calibrate(): the measured step time of `reference` (a
  // run on this machine, every rank busy) against the model's prediction
  // for it, recorded into calibration_path(ranks): a data-parallel
  // reference sets the step factor (two of them at different micro-batch
  // counts also the fixed cost per block and micro-batch); then a tensor
  // 1d, tensor-grid or ring-attention reference sets what each of its
  // collectives waits beyond the model (with the step factor already
  // recorded).
  virtual void record_reference(const RunConfig& reference, int64_t ranks,
                                double measured_step_s) = 0;
  // The search: the best plans for `config` on `ranks` ranks, keeping the
  // sizes and modes the config sets (its other parallel keys are open).
  // Throws ConfigError naming the constraint when no plan remains.
  virtual PlanReport plan(const RunConfig& config, int64_t ranks) = 0;
  // The prediction for the run `config` describes as it stands (no search).
  virtual PlanReport predict(const RunConfig& config, int64_t ranks) = 0;
  // On rank 0 after the finalists ran: records each measured finalist's
  // measured / model_step_s under its family in the calibration in use, so
  // that later predictions on this host use it. Returns the file written,
  // or "" when nothing is recorded (planning from a cluster file's rates).
  virtual std::string record_trials(int64_t ranks, const std::vector<TrialResult>& trials) = 0;
};

}  // namespace kolos
