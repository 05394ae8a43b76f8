// The planner role inside a job (launchers/auto_plan.cpp): the planner
// plugin a config chooses, this machine's calibration by every rank
// together, and parallel.auto's choice of layout before `kolos train`
// builds its engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kolos/core/planner.h"
#include "kolos/core/run_config.h"
#include "kolos/core/runtime.h"

namespace kolos::cli {

// The hosts of the world's ranks, by rank (KOLOS_SIMULATED_HOSTS stands in
// for them). Collective.
std::vector<std::string> rank_hosts(const Runtime& runtime);

// The planner role's plugin for `config` ([plugins] planner, else `autoplan`),
// configured from its [planner] section.
std::shared_ptr<Planner> make_planner(const RunConfig& config);

// Measures this machine for the planner (collective): its rates, then
// reference runs of the config's model whose measured steps the planner
// compares with its predictions: data parallel over every rank (the step
// factor), then, where the ranks make a group of 4, tensor 1d, tensor 2d
// and ring attention over 4 at 2 sequences per micro-batch, so that none
// is a plan `run_planner_check.sh` measures (what each of their many
// collectives costs beyond the model when ranks share cores). Rank 0
// records them, in that order (data parallel again after tensor 1d, whose
// wait its collectives share), once every rank is done with the runs.
void calibrate_machine(const Runtime& runtime, Planner& planner, const std::string& path,
                       std::vector<std::string> overrides, const RunConfig& config);

// parallel.auto = true: the planner chooses the layout on rank 0 (this
// machine calibrated first, once, by every rank together), every rank
// loads the config with the plan's overrides, and rank 0 says what it chose.
// Collective; errors are agreed. Returns the resolved config; `header` gets
// the metrics file's header (the plan as JSON).
RunConfig resolve_auto_plan(const Runtime& runtime, const std::string& path,
                            std::vector<std::string> overrides, const RunConfig& config,
                            std::string* header);

}  // namespace kolos::cli
