// What this kolos and this machine have: `kolos plugins` (the plugins found),
// `kolos topo` (this node's topology) and `kolos version`
// (launchers/info_command.cpp).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

// Each takes the arguments after its command's name and returns the exit
// code; errors are thrown (kolos::Error).
int plugins_command(const std::vector<std::string>& args);
int topo_command(const std::vector<std::string>& args);
int version_command(const std::vector<std::string>& args);

}  // namespace kolos::cli
