// Errors about a value of a run's document found by a rule that lives
// outside the config reader (the model registry, the plugin registry),
// located as the reader's own errors are: "file:line:col: key: message"
// with the source line, or "file: --set key=value: key: message".
//
// A header of its own, not settings.h or model.h: those are included by
// nearly every translation unit, and these two functions by three.
#pragma once

#include <string>

#include "kolos/core/run_config.h"

namespace kolos {

// "<origin of key>: <key>: <message>", the source line under the message's
// first line (the rest, e.g. a plugin registry's "searched:"/"found:"
// lines, follows it). `key` is dotted ("plugins.gradients"). A config built
// in code has no document: the origin is its source name.
std::string located(const RunConfig& config, const std::string& key, const std::string& message);

// ConfigError, located at `[model] name`, unless a model of that name is
// registered (model.cpp; check_model_name(ModelConfig) in model.h is the
// unlocated form).
void check_model_name(const RunConfig& config);

}  // namespace kolos
