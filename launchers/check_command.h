// `kolos check CONFIG [-n N] [--set k=v ...]`: every check a run makes
// before it communicates, with nothing started (launchers/check_command.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/core/engine.h"
#include "kolos/core/run_config.h"

namespace kolos::cli {

// What a run checks on each rank before it communicates (plan_run), and
// that the model exists; the data is opened only by the run.
RunPlan check_run(const RunConfig& config, int64_t ranks);

// `args`: the arguments after `check`. Returns the exit code; a config that
// fails a check is thrown (kolos::Error).
int check_command(const std::vector<std::string>& args);

}  // namespace kolos::cli
