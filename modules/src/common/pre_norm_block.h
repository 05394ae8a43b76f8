// The pre-norm transformer block of gpt, llama and vit:
//   h = x + attn(ln_1(x)),  out = h + mlp(ln_2(h)).
// Each model makes the four parts from its own config (its norm, its
// attention and MLP specs); the block registers them as "ln_1", "attn",
// "ln_2" and "mlp", the names its checkpoints use.
#pragma once

#include "kolos/core/layer_factory.h"

namespace kolos::modules {

class PreNormBlock : public Layer {
 public:
  // Weights are drawn in creation order: make the parts in the order listed
  // (a braced list, PreNormBlock::Parts{...}, evaluates left to right).
  struct Parts {
    LayerPtr ln_1, attn, ln_2, mlp;
  };
  explicit PreNormBlock(Parts parts);
  at::Tensor forward(const at::Tensor& x) override;

 private:
  LayerPtr ln_1_, attn_, ln_2_, mlp_;
};

}  // namespace kolos::modules
