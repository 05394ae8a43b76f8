// `kolos generate CKPT --prompt-ids IDS [-n RANKS] [CONFIG.toml]`
// (launchers/generate_command.cpp; the engine: kolos/inference/engine.h).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

// `args`: the arguments after `generate`; argc/argv: the process's (MPI).
// Returns the exit code.
int generate_command(const std::vector<std::string>& args, int argc, char** argv);

}  // namespace kolos::cli
