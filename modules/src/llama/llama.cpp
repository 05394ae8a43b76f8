#include "kolos/modules/llama.h"

#include <torch/torch.h>

#include "kolos/core/error.h"

namespace kolos::modules {
namespace {

class LlamaEmbedding : public Layer {
 public:
  LlamaEmbedding(LayerFactory& factory, const ModelConfig& c) {
    // No position table: positions enter attention through RoPE.
    wte_ = register_module("wte", factory.embedding(c.vocab, c.hidden, c.init_std));
  }
  at::Tensor forward(const at::Tensor& tokens) override { return wte_->forward(tokens); }

 private:
  LayerPtr wte_;
};

// down(silu(gate(x)) * up(x)): gate and up are column layers sharing one
// prepared input, down a row layer, so tensor-parallel factories split the
// width as they split GPT's MLP.
class SwiGluMlp : public Layer {
 public:
  SwiGluMlp(LayerFactory& factory, const ModelConfig& c) : factory_(&factory) {
    const LinearSpec column{c.hidden,   c.ffn_hidden,        /*bias=*/false, LinearRole::kColumn,
                            c.init_std, /*input_ready=*/true};
    gate_ = register_module("gate_proj", factory.linear(column));
    up_ = register_module("up_proj", factory.linear(column));
    down_ = register_module("down_proj", factory.linear(LinearSpec{c.ffn_hidden, c.hidden, false,
                                                                   LinearRole::kRow, c.init_std}));
  }
  at::Tensor forward(const at::Tensor& input) override {
    const at::Tensor x = factory_->column_input(input);
    return down_->forward(torch::silu(gate_->forward(x)) * up_->forward(x));
  }

 private:
  LayerFactory* factory_;
  LayerPtr gate_, up_, down_;
};

class LlamaBlock : public Layer {
 public:
  LlamaBlock(LayerFactory& factory, const ModelConfig& c) {
    // Hugging Face's LLaMA initialises every linear layer N(0, init_std),
    // without GPT-2's residual scaling.
    AttentionSpec attention{c.hidden, c.heads, c.init_std, c.init_std};
    attention.kv_heads = c.kv_heads;
    attention.bias = false;
    attention.rope_theta = c.rope_theta;
    ln_1_ = register_module("ln_1", factory.rms_norm(c.hidden, c.norm_eps));
    attn_ = register_module("attn", factory.attention(attention));
    ln_2_ = register_module("ln_2", factory.rms_norm(c.hidden, c.norm_eps));
    mlp_ = register_module("mlp", std::make_shared<SwiGluMlp>(factory, c));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor h = x + attn_->forward(ln_1_->forward(x));
    return h + mlp_->forward(ln_2_->forward(h));
  }

 private:
  LayerPtr ln_1_, attn_, ln_2_, mlp_;
};

class LlamaHead : public Layer {
 public:
  LlamaHead(LayerFactory& factory, const ModelConfig& c) {
    ln_f_ = register_module("ln_f", factory.rms_norm(c.hidden, c.norm_eps));
    lm_head_ = register_module("lm_head", factory.lm_head(c.hidden, c.vocab, c.init_std));
  }
  at::Tensor forward(const at::Tensor& x) override { return lm_head_->forward(ln_f_->forward(x)); }

 private:
  LayerPtr ln_f_, lm_head_;
};

}  // namespace

std::shared_ptr<Model> build_llama(const ModelConfig& c, LayerFactory& factory) {
  // load_run_config checks these at their keys and resolves the defaults; a
  // ModelConfig built in code gets the same rules here.
  KOLOS_CHECK_KIND(kConfig, c.hidden % c.heads == 0, "model.hidden = ", c.hidden,
                   " is not divisible by model.heads = ", c.heads);
  KOLOS_CHECK_KIND(kConfig, c.kv_heads > 0 && c.heads % c.kv_heads == 0,
                   "model.kv_heads = ", c.kv_heads, " does not divide model.heads = ", c.heads);
  KOLOS_CHECK_KIND(kConfig, (c.hidden / c.heads) % 2 == 0,
                   "model.hidden / model.heads = ", c.hidden / c.heads,
                   " is odd; rotary position embedding needs it even");
  KOLOS_CHECK_KIND(kConfig, c.ffn_hidden > 0, "model.ffn_hidden = ", c.ffn_hidden,
                   " (load_run_config resolves 0 to its default)");
  auto model = std::make_shared<Model>();
  model->add_block("embed", std::make_shared<LlamaEmbedding>(factory, c));
  for (int64_t i = 0; i < c.layers; ++i) {
    // Repeated: the blocks train.recompute may recompute.
    model->add_block("h." + std::to_string(i), std::make_shared<LlamaBlock>(factory, c),
                     /*repeated=*/true);
  }
  model->add_block("head", std::make_shared<LlamaHead>(factory, c));
  model->set_loss([&factory](const at::Tensor& logits, const at::Tensor& targets) {
    return factory.loss(logits, targets);
  });
  return model;
}

}  // namespace kolos::modules
