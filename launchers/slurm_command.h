// `kolos slurm gen`: writes a ready sbatch script from the template in
// launchers/slurm/kolos.sbatch (launchers/slurm_command.cpp).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

// Returns the exit code: 0 written, 2 usage or config error (thrown as kolos::Error).
int slurm_command(const std::vector<std::string>& args);

}  // namespace kolos::cli
