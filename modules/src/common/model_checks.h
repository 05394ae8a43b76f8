// The rules the model builders apply to a ModelConfig built in code;
// load_run_config checks the same at their keys. Each throws a ConfigError
// naming the model.* keys at fault.
#pragma once

#include <string>

#include "kolos/core/run_config.h"

namespace kolos::modules {

// model.hidden is a whole number of heads: hidden % heads == 0.
void check_heads(const ModelConfig& c);

// An image model's geometry (vit, dit; `model` names it): check_heads,
// positive image_size, patch_size and channels, at least two classes, and
// whole square patches (patch_size divides image_size).
void check_image_model(const ModelConfig& c, const std::string& model);

}  // namespace kolos::modules
