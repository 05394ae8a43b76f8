// `kolos serve CKPT [--host H] [--port P] [-n RANKS] [CONFIG.toml]`: an
// OpenAI-style completions server over the inference engine
// (launchers/serve_command.cpp; docs/inference.md).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

int serve_command(const std::vector<std::string>& args, int argc, char** argv);

}  // namespace kolos::cli
