// `kolos generate CKPT --prompt-ids IDS [-n RANKS] [CONFIG.toml]`
// (launchers/generate_command.cpp; the engine: kolos/inference/engine.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kolos/core/run_config.h"
#include "kolos/inference/config.h"
#include "kolos/tokenizer/tokenizer.h"

namespace kolos::cli {

// Shared with `kolos serve` (serve_command.cpp).
namespace inference_cli {
// The command's configuration: CONFIG.toml (may be empty) and `overrides`;
// sections other than [inference] and [plugins] are refused at their line.
RunConfig command_config(const std::string& config_path, const std::vector<std::string>& overrides,
                         const std::string& command);
// inference.tokenizer, or the model directory's tokenizer.json /
// tokenizer.model; null when there is none.
std::unique_ptr<tokenizer::Tokenizer> open_tokenizer(const inference::InferenceConfig& settings,
                                                     const std::string& model_dir);
// The prefix of streamed `text` that is safe to send while more tokens may
// come: no trailing U+FFFD (a character cut between tokens), not the last
// `hold` bytes (where a stop string may begin), at a character boundary.
size_t stable_prefix(const std::string& text, size_t hold);
}  // namespace inference_cli

// `args`: the arguments after `generate`; argc/argv: the process's (MPI).
// Returns the exit code.
int generate_command(const std::vector<std::string>& args, int argc, char** argv);

}  // namespace kolos::cli
