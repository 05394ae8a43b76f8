// `kolos run -n N CONFIG [--set k=v ...]`: N local ranks of `kolos train`
// through mpirun (launchers/run_command.cpp; the mpirun command:
// launch.h).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

// `args`: the arguments after `run`. Replaces this process with mpirun;
// returns only on a dry run or a failure to start it.
int run_command(const std::vector<std::string>& args);

}  // namespace kolos::cli
