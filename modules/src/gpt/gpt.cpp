#include "kolos/modules/gpt.h"

#include <torch/torch.h>

#include <cmath>

#include "common/model_checks.h"
#include "common/pre_norm_block.h"
#include "kolos/core/error.h"
#include "kolos/modules/dit.h"
#include "kolos/modules/llama.h"
#include "kolos/modules/vit.h"

namespace kolos::modules {
namespace {

class GptEmbedding : public Layer {
 public:
  GptEmbedding(LayerFactory& factory, const ModelConfig& c) : factory_(&factory) {
    wte_ = register_module("wte", factory.embedding(c.vocab, c.hidden, c.init_std));
    wpe_ = register_module("wpe", factory.embedding(c.seq_len, c.hidden, c.init_std));
  }
  at::Tensor forward(const at::Tensor& tokens) override {
    // Global positions: under sequence parallelism a rank's tokens are a
    // slice of the sequence. Made on the CPU; moved where the tokens are.
    at::Tensor positions = factory_->positions(tokens.size(1)).to(tokens.device());
    return wte_->forward(tokens) + wpe_->forward(positions).unsqueeze(0);
  }
  const LayerPtr& token_embedding() const { return wte_; }

 private:
  LayerFactory* factory_;
  LayerPtr wte_, wpe_;
};

// GPT-2: residual output projections scaled by 1/sqrt(2 * layers).
LayerPtr gpt_block(LayerFactory& factory, const ModelConfig& c) {
  const double out_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
  return std::make_shared<PreNormBlock>(PreNormBlock::Parts{
      factory.layer_norm(c.hidden),
      factory.attention(AttentionSpec{c.hidden, c.heads, c.init_std, out_std}),
      factory.layer_norm(c.hidden),
      factory.mlp(MlpSpec{c.hidden, c.mlp_ratio * c.hidden, c.init_std, out_std})});
}

// Final norm and the LM head tied to the token embedding: the embedding is
// held, not registered, so its weight is one parameter of the "embed" block.
class GptHead : public Layer {
 public:
  GptHead(LayerFactory& factory, const ModelConfig& c, LayerPtr token_embedding)
      : factory_(&factory), wte_(std::move(token_embedding)) {
    ln_f_ = register_module("ln_f", factory.layer_norm(c.hidden));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return factory_->tied_logits(ln_f_->forward(x), *wte_);
  }

 private:
  LayerFactory* factory_;
  LayerPtr wte_;
  LayerPtr ln_f_;
};

}  // namespace

std::shared_ptr<Model> build_gpt(const ModelConfig& c, LayerFactory& factory) {
  check_heads(c);
  auto model = std::make_shared<Model>();
  auto embed = std::make_shared<GptEmbedding>(factory, c);
  model->add_block("embed", embed);
  for (int64_t i = 0; i < c.layers; ++i) {
    model->add_block("h." + std::to_string(i), gpt_block(factory, c), /*repeated=*/true);
  }
  model->add_block("head", std::make_shared<GptHead>(factory, c, embed->token_embedding()));
  model->set_loss([&factory](const at::Tensor& logits, const at::Tensor& targets) {
    return factory.loss(logits, targets);
  });
  return model;
}

void register_builtin_models() {
  register_model("gpt", &build_gpt);
  register_model("llama", &build_llama);
  register_model("mixtral", &build_llama);  // llama with mixture-of-experts MLPs
  register_model("vit", &build_vit);
  register_model("dit", &build_dit);
}

}  // namespace kolos::modules
