// `kolos train CONFIG [--set k=v ...] [--resume [DIR]]`: one rank's part
// of a training job, started by mpirun or srun (launchers/train_command.cpp).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

// `args`: the arguments after `train`; argc/argv: the process's (MPI).
// Returns the exit code (kExitStopped when stopped on request).
int train_command(const std::vector<std::string>& args, int argc, char** argv);

}  // namespace kolos::cli
