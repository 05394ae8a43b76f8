#include "kolos/planner/model.h"

#include "kolos/core/error.h"

namespace kolos::planner {

double ModelShape::block_params() const {
  const double h = static_cast<double>(hidden);
  const double kv_dim = static_cast<double>(kv()) * h / static_cast<double>(heads);
  const double f = static_cast<double>(ffn());
  // q and o: h x h with bias; k and v: kv_dim x h with bias; the MLP's two
  // matrices with biases; two LayerNorms (weight and bias).
  return 2 * (h * h + h) + 2 * (h * kv_dim + kv_dim) + 2 * h * f + f + h + 4 * h;
}

double ModelShape::embedding_params() const {
  return static_cast<double>(vocab + seq_len) * static_cast<double>(hidden);
}

double ModelShape::head_params() const { return 2.0 * static_cast<double>(hidden); }

double ModelShape::total_params() const {
  return static_cast<double>(layers) * block_params() + embedding_params() + head_params();
}

void ModelShape::validate() const {
  const std::pair<const char*, int64_t> fields[] = {
      {"layers", layers},   {"hidden", hidden}, {"heads", heads},
      {"seq_len", seq_len}, {"vocab", vocab},   {"ffn_multiplier", ffn_multiplier}};
  for (const auto& [key, value] : fields) {
    if (value <= 0) {
      throw ConfigError("model." + std::string(key) + " = " + std::to_string(value) +
                        ": the planner needs a positive value");
    }
  }
  if (hidden % heads != 0) {
    throw ConfigError("model.heads = " + std::to_string(heads) +
                      " does not divide model.hidden = " + std::to_string(hidden));
  }
  if (kv_heads < 0 || (kv_heads > 0 && heads % kv_heads != 0)) {
    throw ConfigError("model.kv_heads = " + std::to_string(kv_heads) +
                      " must divide model.heads = " + std::to_string(heads));
  }
}

BlockFlops block_forward_flops(const ModelShape& m, double b) {
  const double s = static_cast<double>(m.seq_len), h = static_cast<double>(m.hidden);
  const double kv_dim = static_cast<double>(m.kv()) * h / static_cast<double>(m.heads);
  const double f = static_cast<double>(m.ffn());
  BlockFlops out;
  // 2 FLOPs per multiply-add: q and o (h -> h), k and v (h -> kv_dim), the
  // MLP (h -> f -> h).
  out.gemm = 2 * b * s * h * (2 * h + 2 * kv_dim) + 4 * b * s * h * f;
  // QK^T (b·heads·s·s·d) and probabilities times V, d·heads = h.
  out.attention = 4 * b * s * s * h;
  return out;
}

double logit_forward_flops(const ModelShape& m, double b) {
  return 2 * b * static_cast<double>(m.seq_len) * static_cast<double>(m.hidden) *
         static_cast<double>(m.vocab);
}

double block_forward_elementwise_bytes(const ModelShape& m, double b, double e) {
  const double s = static_cast<double>(m.seq_len), h = static_cast<double>(m.hidden);
  const double bsh = b * s * h;
  // Two LayerNorms (read, write), two residual adds (two reads, a write),
  // GELU over the MLP's width (read, write), and the attention scores:
  // scale-and-mask and softmax each read and write b·heads·s² elements.
  const double norms = 2 * 2 * bsh;
  const double residual = 2 * 3 * bsh;
  const double gelu = 2 * b * s * static_cast<double>(m.ffn());
  const double softmax = 4 * b * static_cast<double>(m.heads) * s * s;
  return e * (norms + residual + gelu + softmax);
}

double megatron_step_flops(const ModelShape& m, double batch) {
  const double s = static_cast<double>(m.seq_len), h = static_cast<double>(m.hidden);
  const double l = static_cast<double>(m.layers), V = static_cast<double>(m.vocab);
  return 96 * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

}  // namespace kolos::planner
