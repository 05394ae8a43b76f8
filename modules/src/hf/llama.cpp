// llama <-> LLaMA (LlamaForCausalLM); the table is in kolos/modules/hf.h.
// The layouts agree (nn::Linear's [out, in], rotate-half RoPE), so both
// directions rename and check shapes only.
#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "hf_detail.h"
#include "kolos/core/error.h"

namespace kolos::modules {
namespace {

using hf_detail::TensorName;

// (kolos name, Hugging Face name) of every tensor of a llama with `c`'s
// shape, with the shape both have.
std::vector<TensorName> llama_names(const ModelConfig& c) {
  const int64_t h = c.hidden, hd = c.hidden / c.heads, kv = c.kv_heads > 0 ? c.kv_heads : c.heads;
  const int64_t f = c.ffn_hidden > 0 ? c.ffn_hidden : default_ffn_hidden(c.hidden);
  std::vector<TensorName> out{{"embed.wte.weight", "model.embed_tokens.weight", {c.vocab, h}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string k = "h." + std::to_string(i) + ".";
    const std::string l = "model.layers." + std::to_string(i) + ".";
    out.push_back({k + "ln_1.weight", l + "input_layernorm.weight", {h}});
    out.push_back({k + "attn.q_proj.weight", l + "self_attn.q_proj.weight", {c.heads * hd, h}});
    out.push_back({k + "attn.k_proj.weight", l + "self_attn.k_proj.weight", {kv * hd, h}});
    out.push_back({k + "attn.v_proj.weight", l + "self_attn.v_proj.weight", {kv * hd, h}});
    out.push_back({k + "attn.o_proj.weight", l + "self_attn.o_proj.weight", {h, c.heads * hd}});
    out.push_back({k + "ln_2.weight", l + "post_attention_layernorm.weight", {h}});
    if (is_moe_block(c, i)) {
      // Mixtral's saved names (transformers 5 converts them to its fused
      // experts on load, and writes them so on save): w1 gate, w3 up, w2 down.
      const std::string moe = l + "block_sparse_moe.";
      out.push_back({k + "mlp.router.weight", moe + "gate.weight", {c.experts, h}});
      for (int64_t e = 0; e < c.experts; ++e) {
        const std::string ke = k + "mlp.experts." + std::to_string(e) + ".";
        const std::string he = moe + "experts." + std::to_string(e) + ".";
        out.push_back({ke + "gate_proj.weight", he + "w1.weight", {f, h}});
        out.push_back({ke + "up_proj.weight", he + "w3.weight", {f, h}});
        out.push_back({ke + "down_proj.weight", he + "w2.weight", {h, f}});
      }
      continue;
    }
    out.push_back({k + "mlp.gate_proj.weight", l + "mlp.gate_proj.weight", {f, h}});
    out.push_back({k + "mlp.up_proj.weight", l + "mlp.up_proj.weight", {f, h}});
    out.push_back({k + "mlp.down_proj.weight", l + "mlp.down_proj.weight", {h, f}});
  }
  out.push_back({"head.ln_f.weight", "model.norm.weight", {h}});
  out.push_back({"head.lm_head.weight", "lm_head.weight", {c.vocab, h}});
  return out;
}

}  // namespace

HfModel llama_to_hf_llama(const ModelConfig& c, const NamedTensors& weights) {
  KOLOS_CHECK_KIND(kConfig, llama_family(c), "model `", c.name, "` is not a llama");
  const bool mixtral = c.name == "mixtral";
  if (mixtral && c.moe_every != 1) {
    throw ConfigError("model.moe_every = " + std::to_string(c.moe_every) +
                      ": MixtralForCausalLM has experts in every block; --format hf exports "
                      "mixtral with moe_every = 1 only");
  }
  if (mixtral && c.router != "softmax") {
    throw ConfigError("model.router = \"" + c.router +
                      "\": MixtralForCausalLM scores experts with a softmax; --format hf "
                      "exports router = \"softmax\" only");
  }
  if (mixtral && c.shared_experts > 0) {
    throw ConfigError("model.shared_experts = " + std::to_string(c.shared_experts) +
                      ": MixtralForCausalLM has no shared experts; --format hf exports "
                      "shared_experts = 0 only");
  }
  if (mixtral && c.capacity_factor > 0) {
    throw ConfigError("model.capacity_factor = " + std::to_string(c.capacity_factor) +
                      ": MixtralForCausalLM routes without dropping tokens; --format hf "
                      "exports dropless mixtral only");
  }
  if (mixtral && c.bias_update_rate > 0) {
    std::ostringstream rate;
    rate << c.bias_update_rate;
    throw ConfigError("model.bias_update_rate = " + rate.str() +
                      ": this mixtral chose its experts with a balancing bias "
                      "(state/*.router_bias in the checkpoint), which MixtralForCausalLM "
                      "has no place for; exported without it, the model would route "
                      "differently. --format hf exports mixtral trained with "
                      "bias_update_rate = 0 only");
  }
  hf_detail::Tensors left(weights, "the checkpoint");
  HfModel hf;
  hf.architecture = mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM";
  for (const TensorName& n : llama_names(c))
    hf.tensors.emplace_back(n.hf, left.take(n.kolos, n.shape));
  left.expect_empty(mixtral ? "Mixtral" : "LLaMA",
                    "is this checkpoint's model a " + c.name +
                        " with layers = " + std::to_string(c.layers) + "?");
  const int64_t kv = c.kv_heads > 0 ? c.kv_heads : c.heads;
  const int64_t f = c.ffn_hidden > 0 ? c.ffn_hidden : default_ffn_hidden(c.hidden);
  std::ostringstream json;
  hf_detail::open_config(json, hf.architecture, mixtral ? "mixtral" : "llama");
  json << "  \"vocab_size\": " << c.vocab << ",\n"
       << "  \"hidden_size\": " << c.hidden << ",\n"
       << "  \"intermediate_size\": " << f << ",\n"
       << "  \"num_hidden_layers\": " << c.layers << ",\n"
       << "  \"num_attention_heads\": " << c.heads << ",\n"
       << "  \"num_key_value_heads\": " << kv << ",\n"
       << "  \"head_dim\": " << c.hidden / c.heads << ",\n"
       << "  \"max_position_embeddings\": " << c.seq_len << ",\n"
       << "  \"rope_theta\": " << c.rope_theta << ",\n"
       << "  \"rope_scaling\": null,\n"
       << "  \"rms_norm_eps\": " << c.norm_eps << ",\n"
       << "  \"hidden_act\": \"silu\",\n"
       << "  \"attention_bias\": false,\n"
       << "  \"mlp_bias\": false,\n"
       << "  \"attention_dropout\": 0.0,\n"
       << "  \"initializer_range\": " << c.init_std << ",\n"
       << "  \"tie_word_embeddings\": false,\n";
  if (mixtral) {
    json << "  \"num_local_experts\": " << c.experts << ",\n"
         << "  \"num_experts_per_tok\": " << c.top_k << ",\n"
         << "  \"router_aux_loss_coef\": " << c.aux_loss_coef << ",\n"
         << "  \"router_jitter_noise\": 0.0,\n"
         << "  \"output_router_logits\": false,\n";
  }
  hf.config_json = hf_detail::close_config(json);
  return hf;
}

namespace hf_detail {

ImportedModel llama_from_hf(const Config& config, const NamedTensors& tensors) {
  ImportedModel out;
  const bool mixtral = config.string("model_type", "llama") == "mixtral";
  out.architecture = mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM";
  ModelConfig& c = out.model;
  c.name = mixtral ? "mixtral" : "llama";
  if (mixtral) {
    c.experts = config.integer("num_local_experts");
    c.top_k = config.integer("num_experts_per_tok");
    c.moe_every = 1;
    c.aux_loss_coef = config.number("router_aux_loss_coef", 0.001);
    c.z_loss_coef = 0;
    c.capacity_factor = 0;
    c.router = "softmax";
    c.shared_experts = 0;
    if (c.experts < 2) config.refuse("num_local_experts", "kolos's mixtral needs at least 2");
    if (c.top_k < 1 || c.top_k > c.experts) {
      config.refuse("num_experts_per_tok", "must be between 1 and num_local_experts");
    }
    // Jitter multiplies the router's input by noise in training; kolos's
    // router has none, so training would differ.
    if (config.number("router_jitter_noise", 0.0) != 0.0) {
      config.refuse("router_jitter_noise", "kolos's mixtral router has no input jitter");
    }
    if (config.has("sliding_window")) {
      config.refuse("sliding_window", "kolos's attention is full causal attention");
    }
  }
  c.hidden = config.integer("hidden_size");
  c.layers = config.integer("num_hidden_layers");
  c.heads = config.integer("num_attention_heads");
  c.kv_heads = config.integer("num_key_value_heads", c.heads);
  c.vocab = config.integer("vocab_size");
  c.ffn_hidden = config.integer("intermediate_size");
  c.seq_len = config.integer("max_position_embeddings", 2048);
  c.rope_theta = config.number("rope_theta", 10000.0);
  c.norm_eps = config.number("rms_norm_eps", 1e-6);
  c.init_std = config.number("initializer_range", c.init_std);
  check_sizes(config, c, {"hidden_size", "num_hidden_layers", "num_attention_heads"});
  if (config.has("head_dim") && config.integer("head_dim") != c.hidden / c.heads) {
    config.refuse("head_dim", "kolos's llama has head_dim = hidden_size / num_attention_heads = " +
                                  std::to_string(c.hidden / c.heads));
  }
  // What kolos's llama computes; anything else would load and compute another function.
  if (config.string("hidden_act", "silu") != "silu") {
    config.refuse("hidden_act", "kolos's " + c.name + " has a SwiGLU MLP (silu)");
  }
  // RoPE: transformers 5 writes {"rope_parameters": {"rope_type", "rope_theta"}},
  // earlier versions rope_theta and rope_scaling at the top.
  const char* kPlainRope =
      "kolos's llama has plain RoPE (LLaMA 3.1's and others' long-context scalings are not "
      "implemented)";
  if (config.has("rope_scaling")) config.refuse("rope_scaling", kPlainRope);
  if (config.has("rope_parameters")) {
    const hf_detail::Config rope = config.object("rope_parameters");
    if (rope.string("rope_type", "default") != "default") rope.refuse("rope_type", kPlainRope);
    c.rope_theta = rope.number("rope_theta", c.rope_theta);
  }
  if (config.boolean("attention_bias", false)) {
    config.refuse("attention_bias", "kolos's llama has no biases");
  }
  if (config.boolean("mlp_bias", false)) config.refuse("mlp_bias", "kolos's llama has no biases");
  const bool tied = config.boolean("tie_word_embeddings", false);

  Tensors left(tensors, config.where().substr(0, config.where().rfind('/')) + " (safetensors)");
  // Non-persistent in current transformers, saved by some older exports.
  for (int64_t i = 0; i < c.layers; ++i) {
    left.drop("model.layers." + std::to_string(i) + ".self_attn.rotary_emb.inv_freq");
  }
  at::Tensor embedding;
  for (const TensorName& n : llama_names(c)) {
    at::Tensor t;
    if (n.hf == "lm_head.weight" && tied) {
      if (left.has("lm_head.weight")) {
        t = left.take("lm_head.weight", n.shape);
        KOLOS_CHECK_KIND(kCheckpoint, torch::equal(t, embedding), config.where(),
                         ": lm_head.weight differs from model.embed_tokens.weight, but "
                         "tie_word_embeddings is true");
      }
      t = embedding.clone();
      out.notes.push_back(
          "config.json has tie_word_embeddings = true; kolos's llama has an untied head, so "
          "head.lm_head.weight starts as a copy of the embedding and trains apart from it");
    } else {
      t = left.take(n.hf, n.shape);
    }
    t = t.to(at::kFloat).contiguous();
    if (n.kolos == "embed.wte.weight") embedding = t;
    out.weights.emplace_back(n.kolos, t);
  }
  left.expect_empty("kolos " + c.name, "is this a " + std::string(mixtral ? "Mixtral" : "LLaMA") +
                                           " with num_hidden_layers = " + std::to_string(c.layers) +
                                           " (config.json)?");
  return out;
}

}  // namespace hf_detail
}  // namespace kolos::modules
