// GPT: token + position embedding, pre-LN transformer blocks (causal
// self-attention, GELU MLP), final LayerNorm and a LM head tied to the token
// embedding — written once against LayerFactory, as a list of blocks:
//   "embed", "h.0" .. "h.{L-1}", "head".
#pragma once

#include <memory>

#include "kolos/core/model.h"

namespace kolos::modules {

std::shared_ptr<Model> build_gpt(const ModelConfig& config, LayerFactory& factory);

// Registers every model of this library ("gpt", "llama", "mixtral", "vit", "dit") with kolos::register_model.
void register_builtin_models();

}  // namespace kolos::modules
