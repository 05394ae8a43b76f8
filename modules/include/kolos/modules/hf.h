// kolos's models as Hugging Face transformers models, both ways: what
// `kolos ckpt export --format hf` writes and `kolos ckpt import --format hf`
// reads.
//
// GPT (GPT2LMHeadModel). The two compute the same function: token + learned
// position embeddings, pre-LN blocks (LayerNorm eps 1e-5, causal attention
// scaled by 1/sqrt(head_dim), an MLP with GELU in its tanh approximation), a
// final LayerNorm and an LM head tied to the token embedding. They store it
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
// rounding only, so an import accepts both. Checkpoints from the Hub name
// the tensors without "transformer." and carry the causal-mask buffers
// `h.i.attn.bias` / `masked_bias`; the import accepts both spellings and
// drops the buffers.
//
// LLaMA (LlamaForCausalLM). Same names and layouts up to renaming, since
// kolos's llama uses nn::Linear's layout, separate q/k/v and gate/up
// projections and the rotate-half RoPE convention Hugging Face uses:
//
//   kolos                                LlamaForCausalLM
//   embed.wte.weight                     model.embed_tokens.weight
//   h.i.ln_1.weight                      model.layers.i.input_layernorm.weight
//   h.i.attn.{q,k,v,o}_proj.weight       model.layers.i.self_attn.{q,k,v,o}_proj.weight
//   h.i.ln_2.weight                      model.layers.i.post_attention_layernorm.weight
//   h.i.mlp.{gate,up,down}_proj.weight   model.layers.i.mlp.{gate,up,down}_proj.weight
//   head.ln_f.weight                     model.norm.weight
//   head.lm_head.weight                  lm_head.weight
//
// kolos's llama head is untied; a model with tie_word_embeddings imports
// with lm_head.weight a copy of the embedding (the same function at step 0;
// the two train apart from then on, which the import says).
//
// ViT (ViTForImageClassification). hidden_act "gelu" (ViTConfig's default)
// is model.activation = "gelu", "gelu_pytorch_tanh" or "gelu_new" is
// "gelu_tanh" (exported as "gelu_pytorch_tanh"); other activations are
// refused, naming the key. layer_norm_eps is model.norm_eps both ways
// (ViTConfig's default 1e-12). With P = patch_size, C = channels, N = patches:
//
//   kolos                                ViTForImageClassification
//   embed.patch_proj.weight [H, P*P*C]   vit.embeddings.patch_embeddings.projection.weight
//                                        [H, C, P, P] (Conv2d; kolos flattens a patch of
//                                        its HWC pixels as (row, column, channel), so
//                                        W[o, (r*P + s)*C + c] = conv[o, c, r, s])
//   embed.patch_proj.bias                ...projection.bias
//   embed.cls_token [H]                  vit.embeddings.cls_token [1, 1, H]
//   embed.pos_embed [N+1, H]             vit.embeddings.position_embeddings [1, N+1, H]
//   h.i.ln_1.{weight,bias}               vit.encoder.layer.i.layernorm_before
//   h.i.attn.{q,k,v}_proj                vit.encoder.layer.i.attention.attention.{query,key,value}
//   h.i.attn.o_proj                      vit.encoder.layer.i.attention.output.dense
//   h.i.ln_2                             vit.encoder.layer.i.layernorm_after
//   h.i.mlp.up_proj [R*H, H]             vit.encoder.layer.i.intermediate.dense
//                                        (intermediate_size = mlp_ratio R x H)
//   h.i.mlp.down_proj [H, R*H]           vit.encoder.layer.i.output.dense
//   head.ln_f                            vit.layernorm
//   head.classifier.weight [classes, H]  classifier.weight
//   (no bias)                            classifier.bias: zero on export
//
// Both take the class token's output of the final LayerNorm. kolos's head
// has no bias, so an import moves a non-zero classifier.bias b into
// head.ln_f.bias (+ pinv(W) b: the same logits when classifier.weight W has
// full row rank) and says so; qkv_bias = false imports zero q/k/v biases.
// Patches are numbered row by row in both. classes = len(id2label) (or
// num_labels).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "kolos/core/run_config.h"

namespace kolos::modules {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct HfModel {
  NamedTensors tensors;     // the transformers model's state dict (tied weights left out)
  std::string config_json;  // config.json for from_pretrained()
  std::string architecture;  // "GPT2LMHeadModel", "LlamaForCausalLM", ...
};

// Converts the global weights of a model (names as kolos saves them, without
// "model/") to its Hugging Face counterpart's: `gpt` to GPT-2, `llama` to
// LLaMA, `vit` to ViT. Throws ConfigError for a model without one, and a
// kolos::Error of kind checkpoint naming the tensor when one is missing, has
// another shape than `model` implies, or has no counterpart.
HfModel to_hf(const ModelConfig& model, const NamedTensors& weights);
HfModel gpt_to_hf_gpt2(const ModelConfig& model, const NamedTensors& weights);
HfModel llama_to_hf_llama(const ModelConfig& model, const NamedTensors& weights);
HfModel vit_to_hf_vit(const ModelConfig& model, const NamedTensors& weights);

struct ImportedModel {
  ModelConfig model;            // [model] of a run that loads `weights`
  NamedTensors weights;         // kolos names, fp32, global
  std::string architecture;     // "GPT2LMHeadModel", "LlamaForCausalLM", ...
  std::vector<std::string> notes;  // what the conversion changed (said to the user)
};

// A Hugging Face model (its config.json text and its safetensors weights)
// as a kolos model. `where` names the directory in messages. Throws a
// kolos::Error of kind checkpoint naming the key of config.json that kolos
// cannot honour (an architecture it has no model for, rope_scaling,
// attention biases, ...), or the tensor that is missing, extra or of the
// wrong shape.
ImportedModel from_hf(const std::string& config_json, const NamedTensors& tensors,
                      const std::string& where);

}  // namespace kolos::modules
