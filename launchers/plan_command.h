// `kolos plan CONFIG -n N` (the planner's best layouts, --memory: the
// per-rank memory table, --tune K: the finalists measured) and `kolos
// calibrate CONFIG -n N` (this machine measured for the planner)
// (launchers/plan_command.cpp).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

// `args`: the arguments after `plan`; argc/argv: the process's (MPI, for
// --worker). Returns the exit code (--memory: 1 when the estimate exceeds
// the budget).
int plan_command(const std::vector<std::string>& args, int argc, char** argv);

// `args`: the arguments after `calibrate`; argc/argv: the process's (MPI,
// for --worker). Returns the exit code.
int calibrate_command(const std::vector<std::string>& args, int argc, char** argv);

}  // namespace kolos::cli
