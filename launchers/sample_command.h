// `kolos sample`: images from a diffusion checkpoint (launchers/sample_command.cpp).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

// Returns the exit code: 0 ok; errors are thrown (kolos::Error).
int sample_command(const std::vector<std::string>& args);

}  // namespace kolos::cli
