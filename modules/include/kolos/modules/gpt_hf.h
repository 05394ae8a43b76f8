// kolos's GPT as Hugging Face transformers' GPT-2 (GPT2LMHeadModel): what
// `kolos ckpt export --format hf` writes.
//
// The two models compute the same function: token + learned position
// embeddings, pre-LN blocks (LayerNorm eps 1e-5, causal attention scaled by
// 1/sqrt(head_dim), a 4x MLP with GELU in its tanh approximation), a final
// LayerNorm and an LM head tied to the token embedding. They store it
// differently, and the conversion is exact (copies and transposes only):
//
//   kolos                                GPT2LMHeadModel
//   embed.wte.weight [V, H]              transformer.wte.weight
//   embed.wpe.weight [T, H]              transformer.wpe.weight
//   h.i.ln_1.{weight,bias}               transformer.h.i.ln_1.{weight,bias}
//   h.i.attn.{q,k,v}_proj.weight [H, H]  transformer.h.i.attn.c_attn.weight [H, 3H]
//                                        = [Wq^T | Wk^T | Wv^T] (Conv1D stores [in, out])
//   h.i.attn.{q,k,v}_proj.bias           transformer.h.i.attn.c_attn.bias = [bq | bk | bv]
//   h.i.attn.o_proj.weight [H, H]        transformer.h.i.attn.c_proj.weight = W^T
//   h.i.ln_2                             transformer.h.i.ln_2
//   h.i.mlp.up_proj.weight [4H, H]       transformer.h.i.mlp.c_fc.weight = W^T [H, 4H]
//   h.i.mlp.down_proj.weight [H, 4H]     transformer.h.i.mlp.c_proj.weight = W^T [4H, H]
//   head.ln_f                            transformer.ln_f
//   (tied: no weight of its own)         lm_head.weight, tied (tie_word_embeddings)
//
// kolos keeps q, k and v as separate projections (tensor parallelism splits
// heads across them) and nn::Linear's [out, in] weights; GPT-2's fused
// c_attn and [in, out] Conv1D layout would cost every strategy a special
// case, so the conversion lives here, at the edge. The activation is written
// as "gelu_pytorch_tanh" (torch's own tanh GELU, the op kolos calls);
// GPT-2's "gelu_new" is the same formula evaluated in Python and differs by
// rounding only.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "kolos/core/run_config.h"

namespace kolos::modules {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct HfModel {
  NamedTensors tensors;     // GPT2LMHeadModel's state dict, lm_head left to the tie
  std::string config_json;  // config.json for from_pretrained()
};

// Converts the global weights of a `gpt` model (names as kolos saves them,
// without "model/") to GPT-2's. Throws ConfigError for another model, and a
// kolos::Error of kind checkpoint naming the tensor when one is missing, has
// another shape than `model` implies, or has no GPT-2 counterpart.
HfModel gpt_to_hf_gpt2(const ModelConfig& model, const NamedTensors& weights);

}  // namespace kolos::modules
