// `kolos ckpt inspect|verify|export` (launchers/ckpt_command.cpp).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

// Returns the exit code: 0 ok, 1 a damaged checkpoint (verify), 2 usage.
int ckpt_command(const std::vector<std::string>& args);

}  // namespace kolos::cli
