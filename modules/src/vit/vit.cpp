#include "kolos/modules/vit.h"

#include <torch/torch.h>

#include <cmath>

#include "common/model_checks.h"
#include "common/pre_norm_block.h"
#include "kolos/core/error.h"

namespace kolos::modules {
namespace {

// Patches of the unpacked pixels -> linear projection, with the class token
// in front and learned positions added. The projection is a replicated
// linear layer and the class token and the positions are plain parameters:
// whole and replicated under every factory, drawn from the default
// generator in creation order like every weight.
class VitEmbedding : public Layer {
 public:
  explicit VitEmbedding(LayerFactory& factory, const ModelConfig& c)
      : factory_(&factory), image_(c.image_size), patch_(c.patch_size), channels_(c.channels) {
    const int64_t patch_dim = patch_ * patch_ * channels_;
    const int64_t tokens = (image_ / patch_) * (image_ / patch_) + 1;
    proj_ = register_module(
        "patch_proj",
        factory.linear(LinearSpec{patch_dim, c.hidden, true, LinearRole::kReplicated, c.init_std}));
    cls_ = register_parameter("cls_token", torch::randn({c.hidden}) * c.init_std);
    pos_ = register_parameter("pos_embed", torch::randn({tokens, c.hidden}) * c.init_std);
  }
  at::Tensor forward(const at::Tensor& samples) override {
    // [B, H*W*C] int64 -> the float32 pixels whose bits they carry.
    // (cls_token [hidden] and pos_embed [tokens, hidden] have no leading
    // dimension of 1: ZeRO-3 shards dimension 0.)
    const int64_t batch = samples.size(0);
    KOLOS_CHECK_EQ(samples.size(1), image_ * image_ * channels_,
                   "vit: values per sample (image_size^2 * channels)");
    at::Tensor pixels = samples.to(at::kInt).view(at::kFloat);
    const int64_t side = image_ / patch_;
    at::Tensor patches = pixels.reshape({batch, side, patch_, side, patch_, channels_})
                             .permute({0, 1, 3, 2, 4, 5})
                             .reshape({batch, side * side, patch_ * patch_ * channels_})
                             .to(pos_.scalar_type());
    at::Tensor x = proj_->forward(patches);
    x = torch::cat({cls_.view({1, 1, -1}).expand({batch, 1, x.size(2)}), x}, 1);
    // Whole on every tensor-parallel rank so far; the blocks take this
    // rank's block of it (the grids cut the batch and the features).
    return factory_->to_local(x + pos_.unsqueeze(0));
  }

 private:
  LayerFactory* factory_;
  int64_t image_, patch_, channels_;
  LayerPtr proj_;
  at::Tensor cls_, pos_;
};

// model.activation (checked when the config was read; checked again here
// for a ModelConfig built in code).
Activation vit_activation(const std::string& name) {
  if (name == "gelu") return Activation::kGelu;
  KOLOS_CHECK_KIND(kConfig, name == "gelu_tanh", "model.activation = \"", name,
                   "\" is not one of \"gelu_tanh\", \"gelu\"");
  return Activation::kGeluTanh;
}

LayerPtr vit_block(LayerFactory& factory, const ModelConfig& c) {
  const double out_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
  AttentionSpec attention{c.hidden, c.heads, c.init_std, out_std};
  attention.causal = false;
  MlpSpec mlp{c.hidden, c.mlp_ratio * c.hidden, c.init_std, out_std};
  mlp.activation = vit_activation(c.activation);
  return std::make_shared<PreNormBlock>(
      PreNormBlock::Parts{factory.layer_norm(c.hidden, c.norm_eps), factory.attention(attention),
                          factory.layer_norm(c.hidden, c.norm_eps), factory.mlp(mlp)});
}

// Final norm, then the class token's logits [B, classes(local)]. The head is
// the factory's lm_head over `classes` outputs, so it is cut (column-parallel
// over the classes) and read by loss() as an LM head is.
class VitHead : public Layer {
 public:
  VitHead(LayerFactory& factory, const ModelConfig& c) {
    ln_f_ = register_module("ln_f", factory.layer_norm(c.hidden, c.norm_eps));
    head_ = register_module("classifier", factory.lm_head(c.hidden, c.classes, c.init_std));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return head_->forward(ln_f_->forward(x).select(1, 0).contiguous());
  }

 private:
  LayerPtr ln_f_, head_;
};

}  // namespace

std::shared_ptr<Model> build_vit(const ModelConfig& c, LayerFactory& factory) {
  check_image_model(c, "vit");
  auto model = std::make_shared<Model>();
  model->add_block("embed", std::make_shared<VitEmbedding>(factory, c));
  for (int64_t i = 0; i < c.layers; ++i) {
    model->add_block("h." + std::to_string(i), vit_block(factory, c), /*repeated=*/true);
  }
  model->add_block("head", std::make_shared<VitHead>(factory, c));
  // The label is the last value of a sample: the targets' last column.
  model->set_loss([&factory](const at::Tensor& logits, const at::Tensor& targets) {
    return factory.loss(logits, targets.select(1, targets.size(1) - 1).contiguous());
  });
  return model;
}

}  // namespace kolos::modules
