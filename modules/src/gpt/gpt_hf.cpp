#include "kolos/modules/gpt_hf.h"

#include <torch/torch.h>

#include <map>
#include <sstream>

#include "kolos/core/error.h"

namespace kolos::modules {

HfModel gpt_to_hf_gpt2(const ModelConfig& c, const NamedTensors& weights) {
  KOLOS_CHECK_KIND(kConfig, c.name == "gpt", "model `", c.name,
                   "` has no Hugging Face counterpart; --format hf converts `gpt` (GPT-2)");
  std::map<std::string, at::Tensor> left;
  for (const auto& [name, tensor] : weights) left.emplace(name, tensor);
  const int64_t h = c.hidden, inner = c.mlp_ratio * c.hidden;

  // Takes the kolos tensor `name`, checking its shape.
  auto take = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = left.find(name);
    KOLOS_CHECK_KIND(kCheckpoint, it != left.end(), "the checkpoint has no tensor `", name,
                     "`, which a gpt model with layers = ", c.layers, " has");
    KOLOS_CHECK_KIND(kCheckpoint, it->second.sizes().vec() == shape, "tensor `", name,
                     "` has shape ", it->second.sizes(), ", the configuration's model needs ",
                     c10::IntArrayRef(shape));
    at::Tensor t = it->second;
    left.erase(it);
    return t;
  };
  // nn::Linear's [out, in] to Conv1D's [in, out].
  auto conv1d = [](const at::Tensor& w) { return w.t().contiguous(); };

  HfModel hf;
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
  KOLOS_CHECK_KIND(kCheckpoint, left.empty(), "tensor `", left.empty() ? "" : left.begin()->first,
                   "` has no GPT-2 counterpart (", left.size(),
                   " left over); is this checkpoint's model a gpt with layers = ", c.layers, "?");

  std::ostringstream json;
  json.precision(17);
  json << "{\n"
       << "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
       << "  \"model_type\": \"gpt2\",\n"
       << "  \"vocab_size\": " << c.vocab << ",\n"
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
       << "  \"tie_word_embeddings\": true,\n"
       << "  \"torch_dtype\": \"float32\"\n"
       << "}\n";
  hf.config_json = json.str();
  return hf;
}

}  // namespace kolos::modules
