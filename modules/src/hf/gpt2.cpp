// GPT <-> GPT-2 (GPT2LMHeadModel); the table is in kolos/modules/hf.h.
#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "hf_detail.h"
#include "kolos/core/error.h"

namespace kolos::modules {

HfModel gpt_to_hf_gpt2(const ModelConfig& c, const NamedTensors& weights) {
  KOLOS_CHECK_KIND(kConfig, c.name == "gpt", "model `", c.name,
                   "` has no Hugging Face counterpart; --format hf converts `gpt` (GPT-2)");
  hf_detail::Tensors left(weights, "the checkpoint");
  const int64_t h = c.hidden, inner = c.mlp_ratio * c.hidden;
  auto take = [&](const std::string& name, std::vector<int64_t> shape) {
    return left.take(name, shape);
  };
  // nn::Linear's [out, in] to Conv1D's [in, out].
  auto conv1d = [](const at::Tensor& w) { return w.t().contiguous(); };

  HfModel hf;
  hf.architecture = "GPT2LMHeadModel";
  auto put = [&](const std::string& name, at::Tensor t) {
    hf.tensors.emplace_back("transformer." + name, std::move(t));
  };
  put("wte.weight", take("embed.wte.weight", {c.vocab, h}));
  put("wpe.weight", take("embed.wpe.weight", {c.seq_len, h}));
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string k = "h." + std::to_string(i) + ".";
    put(k + "ln_1.weight", take(k + "ln_1.weight", {h}));
    put(k + "ln_1.bias", take(k + "ln_1.bias", {h}));
    std::vector<at::Tensor> qkv_w, qkv_b;
    for (const char* p : {"q", "k", "v"}) {
      qkv_w.push_back(take(k + "attn." + p + "_proj.weight", {h, h}).t());
      qkv_b.push_back(take(k + "attn." + p + "_proj.bias", {h}));
    }
    put(k + "attn.c_attn.weight", torch::cat(qkv_w, 1));
    put(k + "attn.c_attn.bias", torch::cat(qkv_b, 0));
    put(k + "attn.c_proj.weight", conv1d(take(k + "attn.o_proj.weight", {h, h})));
    put(k + "attn.c_proj.bias", take(k + "attn.o_proj.bias", {h}));
    put(k + "ln_2.weight", take(k + "ln_2.weight", {h}));
    put(k + "ln_2.bias", take(k + "ln_2.bias", {h}));
    put(k + "mlp.c_fc.weight", conv1d(take(k + "mlp.up_proj.weight", {inner, h})));
    put(k + "mlp.c_fc.bias", take(k + "mlp.up_proj.bias", {inner}));
    put(k + "mlp.c_proj.weight", conv1d(take(k + "mlp.down_proj.weight", {h, inner})));
    put(k + "mlp.c_proj.bias", take(k + "mlp.down_proj.bias", {h}));
  }
  put("ln_f.weight", take("head.ln_f.weight", {h}));
  put("ln_f.bias", take("head.ln_f.bias", {h}));
  left.expect_empty("GPT-2", "is this checkpoint's model a gpt with layers = " +
                                 std::to_string(c.layers) + "?");

  std::ostringstream json;
  hf_detail::open_config(json, hf.architecture, "gpt2");
  json << "  \"vocab_size\": " << c.vocab << ",\n"
       << "  \"n_positions\": " << c.seq_len << ",\n"
       << "  \"n_embd\": " << h << ",\n"
       << "  \"n_layer\": " << c.layers << ",\n"
       << "  \"n_head\": " << c.heads << ",\n"
       << "  \"n_inner\": " << inner << ",\n"
       << "  \"activation_function\": \"gelu_pytorch_tanh\",\n"
       << "  \"layer_norm_epsilon\": 1e-05,\n"
       << "  \"scale_attn_weights\": true,\n"
       << "  \"scale_attn_by_inverse_layer_idx\": false,\n"
       << "  \"reorder_and_upcast_attn\": false,\n"
       << "  \"resid_pdrop\": 0.0,\n"
       << "  \"embd_pdrop\": 0.0,\n"
       << "  \"attn_pdrop\": 0.0,\n"
       << "  \"initializer_range\": " << c.init_std << ",\n"
       << "  \"tie_word_embeddings\": true,\n";
  hf.config_json = hf_detail::close_config(json);
  return hf;
}

namespace hf_detail {

ImportedModel gpt2_from_hf(const Config& config, const NamedTensors& tensors) {
  ImportedModel out;
  out.architecture = "GPT2LMHeadModel";
  ModelConfig& c = out.model;
  c.name = "gpt";
  c.hidden = config.integer("n_embd");
  c.layers = config.integer("n_layer");
  c.heads = config.integer("n_head");
  c.vocab = config.integer("vocab_size");
  c.seq_len = config.integer("n_positions", config.integer("n_ctx", 1024));
  c.init_std = config.number("initializer_range", c.init_std);
  check_sizes(config, c, {"n_embd", "n_layer", "n_head"});
  const int64_t inner = config.integer("n_inner", 4 * c.hidden);
  if (inner % c.hidden != 0) {
    config.refuse("n_inner", "kolos's gpt has an MLP of model.mlp_ratio x hidden; n_inner = " +
                                 std::to_string(inner) + " is not a multiple of n_embd = " +
                                 std::to_string(c.hidden));
  }
  c.mlp_ratio = inner / c.hidden;
  // What kolos's gpt computes; anything else would load and compute another function.
  const std::string act = config.string("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    config.refuse("activation_function",
                  "kolos's gpt uses GELU's tanh approximation (\"gelu_new\" or "
                  "\"gelu_pytorch_tanh\")");
  }
  if (std::abs(config.number("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12) {
    config.refuse("layer_norm_epsilon", "kolos's gpt uses LayerNorm eps 1e-5");
  }
  if (!config.boolean("scale_attn_weights", true)) {
    config.refuse("scale_attn_weights", "kolos's gpt scales attention by 1/sqrt(head_dim)");
  }
  if (config.boolean("scale_attn_by_inverse_layer_idx", false)) {
    config.refuse("scale_attn_by_inverse_layer_idx", "kolos's gpt does not scale by layer");
  }
  if (!config.boolean("tie_word_embeddings", true)) {
    config.refuse("tie_word_embeddings", "kolos's gpt ties its LM head to the token embedding");
  }

  // Hub checkpoints name tensors without "transformer."; save_pretrained()
  // with it. Either way the same tensors.
  NamedTensors renamed;
  for (const auto& [name, t] : tensors) {
    const std::string prefix = "transformer.";
    renamed.emplace_back(name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name, t);
  }
  Tensors left(renamed, config.where().substr(0, config.where().rfind('/')) + " (safetensors)");
  const int64_t h = c.hidden;
  auto put = [&](const std::string& name, const at::Tensor& t) {
    out.weights.emplace_back(name, t.to(at::kFloat).contiguous());
  };
  // Conv1D's [in, out] to nn::Linear's [out, in].
  auto linear = [](const at::Tensor& w) { return w.t(); };
  const at::Tensor wte = left.take("wte.weight", {c.vocab, h});
  put("embed.wte.weight", wte);
  put("embed.wpe.weight", left.take("wpe.weight", {c.seq_len, h}));
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string k = "h." + std::to_string(i) + ".";
    // The causal mask, stored by older transformers as buffers.
    left.drop(k + "attn.bias");
    left.drop(k + "attn.masked_bias");
    put(k + "ln_1.weight", left.take(k + "ln_1.weight", {h}));
    put(k + "ln_1.bias", left.take(k + "ln_1.bias", {h}));
    const auto w = left.take(k + "attn.c_attn.weight", {h, 3 * h}).split(h, 1);
    const auto b = left.take(k + "attn.c_attn.bias", {3 * h}).split(h, 0);
    const char* names[] = {"q", "k", "v"};
    for (int j = 0; j < 3; ++j) {
      put(k + "attn." + names[j] + "_proj.weight", linear(w[j]));
      put(k + "attn." + names[j] + "_proj.bias", b[j]);
    }
    put(k + "attn.o_proj.weight", linear(left.take(k + "attn.c_proj.weight", {h, h})));
    put(k + "attn.o_proj.bias", left.take(k + "attn.c_proj.bias", {h}));
    put(k + "ln_2.weight", left.take(k + "ln_2.weight", {h}));
    put(k + "ln_2.bias", left.take(k + "ln_2.bias", {h}));
    put(k + "mlp.up_proj.weight", linear(left.take(k + "mlp.c_fc.weight", {h, inner})));
    put(k + "mlp.up_proj.bias", left.take(k + "mlp.c_fc.bias", {inner}));
    put(k + "mlp.down_proj.weight", linear(left.take(k + "mlp.c_proj.weight", {inner, h})));
    put(k + "mlp.down_proj.bias", left.take(k + "mlp.c_proj.bias", {h}));
  }
  put("head.ln_f.weight", left.take("ln_f.weight", {h}));
  put("head.ln_f.bias", left.take("ln_f.bias", {h}));
  // A tied head saved anyway must be the embedding itself.
  if (left.has("lm_head.weight")) {
    const at::Tensor head = left.take("lm_head.weight", {c.vocab, h});
    KOLOS_CHECK_KIND(kCheckpoint, torch::equal(head, wte), config.where(),
                     ": lm_head.weight differs from wte.weight, but tie_word_embeddings is true");
  }
  left.expect_empty("kolos gpt", "is this a GPT-2 with n_layer = " + std::to_string(c.layers) +
                                     " (config.json)?");
  return out;
}

}  // namespace hf_detail

}  // namespace kolos::modules
