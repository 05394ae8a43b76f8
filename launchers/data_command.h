// `kolos data prepare`: a data file for a run's [data] section from text or
// images (launchers/data_command.cpp).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

// `args`: the arguments after `data` (`prepare ...`). Returns the exit code;
// errors are thrown (kolos::Error).
int data_command(const std::vector<std::string>& args);

}  // namespace kolos::cli
