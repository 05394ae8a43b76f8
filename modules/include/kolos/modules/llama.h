// LLaMA: token embedding, pre-norm transformer blocks (RMSNorm, causal
// self-attention with rotary position embedding and grouped-query
// attention, SwiGLU MLP), final RMSNorm and an untied LM head; no biases —
// written once against LayerFactory, as a list of blocks:
//   "embed", "h.0" .. "h.{L-1}", "head".
// Parameter names and shapes follow Hugging Face's LlamaForCausalLM
// (embed.wte.weight ~ model.embed_tokens.weight, h.{i}.attn.q_proj.weight
// [heads*head_dim, hidden], ..., head.lm_head.weight [vocab, hidden]), and
// RoPE uses its rotate_half layout, so its weights load without permutation.
#pragma once

#include <memory>

#include "kolos/core/model.h"

namespace kolos::modules {

std::shared_ptr<Model> build_llama(const ModelConfig& config, LayerFactory& factory);

}  // namespace kolos::modules
