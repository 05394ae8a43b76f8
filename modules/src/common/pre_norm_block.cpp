#include "pre_norm_block.h"

#include <utility>

namespace kolos::modules {

PreNormBlock::PreNormBlock(Parts parts) {
  ln_1_ = register_module("ln_1", std::move(parts.ln_1));
  attn_ = register_module("attn", std::move(parts.attn));
  ln_2_ = register_module("ln_2", std::move(parts.ln_2));
  mlp_ = register_module("mlp", std::move(parts.mlp));
}

at::Tensor PreNormBlock::forward(const at::Tensor& x) {
  at::Tensor h = x + attn_->forward(ln_1_->forward(x));
  return h + mlp_->forward(ln_2_->forward(h));
}

}  // namespace kolos::modules
