#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "kolos/core/attention_cache.h"
#include "kolos/core/error.h"
#include "kolos/core/layer_factory.h"
#include "kolos/core/recompute.h"
#include "kolos/core/sequence.h"
#include "kolos/kernels/activation.h"

namespace kolos {

at::Tensor Layer::register_placed(const std::string& name, at::Tensor tensor,
                                  Placement placement) {
  KOLOS_CHECK(tensor.sizes().vec() == placement.local_shape(), "parameter `", name,
              "` has shape ", tensor.sizes(), " but its placement ", placement.to_string(),
              " needs a local shape of ", c10::IntArrayRef(placement.local_shape()));
  placements_[name] = std::move(placement);
  return register_parameter(name, std::move(tensor));
}

int64_t pack_for_inference(torch::nn::Module& root) {
  torch::NoGradGuard no_grad;
  int64_t packed = 0;
  for (const auto& module : root.modules(/*include_self=*/true)) {
    if (auto* layer = dynamic_cast<Layer*>(module.get())) {
      packed += layer->pack_for_inference() ? 1 : 0;
    }
  }
  return packed;
}

namespace {

class DenseLinear : public Layer {
 public:
  explicit DenseLinear(const LinearSpec& spec) {
    weight_ = register_placed("weight", torch::randn({spec.out, spec.in}) * spec.init_std,
                              Placement::replicated({spec.out, spec.in}));
    if (spec.bias) {
      bias_ = register_placed("bias", torch::zeros({spec.out}),
                              Placement::replicated({spec.out}));
    }
  }
  at::Tensor forward(const at::Tensor& x) override {
    if (packed_.defined()) return packed_(x, bias_);
    return torch::nn::functional::linear(x, weight_, bias_);
  }
  bool pack_for_inference() override {
    if (!PackedLinear::packs(weight_)) return false;
    packed_ = PackedLinear(weight_);
    weight_.set_data(torch::empty({0}, weight_.options()));  // the packed copy replaces it
    return true;
  }

 private:
  at::Tensor weight_, bias_;
  PackedLinear packed_;
};

class DenseEmbedding : public Layer {
 public:
  DenseEmbedding(int64_t num, int64_t dim, double init_std) {
    weight_ = register_placed("weight", torch::randn({num, dim}) * init_std,
                              Placement::replicated({num, dim}));
  }
  at::Tensor forward(const at::Tensor& ids) override { return torch::embedding(weight_, ids); }
  // The lookup keeps reading the dense table. A tied head reads a packed
  // copy, made when it first asks (a table no head reads, as GPT's
  // positions, is not copied).
  bool pack_for_inference() override {
    pack_table_ = PackedLinear::packs(weight_);
    return false;
  }
  const PackedLinear* packed_table() const override {
    if (!pack_table_) return nullptr;
    if (!packed_.defined()) packed_ = PackedLinear(weight_);
    return &packed_;
  }

 private:
  at::Tensor weight_;
  bool pack_table_ = false;
  mutable PackedLinear packed_;
};

class DenseLayerNorm : public Layer {
 public:
  DenseLayerNorm(int64_t dim, double eps) : dim_(dim), eps_(eps) {
    weight_ = register_placed("weight", torch::ones({dim}), Placement::replicated({dim}));
    bias_ = register_placed("bias", torch::zeros({dim}), Placement::replicated({dim}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return torch::layer_norm(x, {dim_}, weight_, bias_, eps_);
  }

 private:
  int64_t dim_;
  double eps_;
  at::Tensor weight_, bias_;
};

class DenseRmsNorm : public Layer {
 public:
  DenseRmsNorm(int64_t dim, double eps) : eps_(eps) {
    weight_ = register_placed("weight", torch::ones({dim}), Placement::replicated({dim}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return rms_normalize(x, x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true), eps_) * weight_;
  }

 private:
  double eps_;
  at::Tensor weight_;
};

// Rotary position embedding (RoPE) in Hugging Face's LLaMA layout: a head's
// features are two halves, feature i and i + d/2 rotated together by the
// angle position * theta^(-2i/d). Meta's original code rotates interleaved
// pairs (2i, 2i+1) instead; Hugging Face permutes the q/k weights once when
// converting, so with its layout Hugging Face LLaMA weights load as they are.
// cos/sin as transformers computes them (float32), for [batch, heads, seq, d].
std::pair<at::Tensor, at::Tensor> rope_angles(const at::Tensor& positions, int64_t dim,
                                              double theta, const at::TensorOptions& options) {
  at::Tensor exponent = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / double(dim);
  at::Tensor inv_freq = 1.0 / torch::pow(theta, exponent);
  at::Tensor freqs = torch::outer(positions.to(torch::kFloat32), inv_freq);
  at::Tensor angles = torch::cat({freqs, freqs}, -1);  // [seq, dim]
  return {angles.cos().to(options), angles.sin().to(options)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

// softmax(QK^T / sqrt(d)) V without a mask, over [B, h, T, d] q, k, v
// (AttentionSpec::causal = false).
at::Tensor bidirectional_attention(const std::vector<at::Tensor>& qkv) {
  const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(3)));
  return torch::matmul(torch::softmax(scores, -1), v);
}

// Causal self-attention with separate q/k/v projections (column) and an
// output projection (row), so tensor-parallel factories split heads simply.
class CausalSelfAttention : public Layer {
 public:
  CausalSelfAttention(LayerFactory& factory, const AttentionSpec& spec)
      : factory_(&factory),
        heads_(factory.local_heads(spec.heads)),
        head_dim_(spec.hidden / spec.heads),
        rope_theta_(spec.rope_theta),
        causal_(spec.causal) {
    KOLOS_CHECK_KIND(kConfig, spec.hidden % spec.heads == 0, "hidden size ", spec.hidden,
                     " is not divisible by the ", spec.heads, " attention heads");
    const int64_t kv_heads = spec.kv_heads > 0 ? spec.kv_heads : spec.heads;
    KOLOS_CHECK_KIND(kConfig, spec.heads % kv_heads == 0, "the ", spec.heads,
                     " attention heads do not divide into groups of the ", kv_heads,
                     " key/value heads");
    KOLOS_CHECK_KIND(kConfig, rope_theta_ <= 0 || head_dim_ % 2 == 0, "rotary embedding needs ",
                     "an even head dimension; hidden ", spec.hidden, " / ", spec.heads,
                     " heads = ", head_dim_);
    // Contiguous head blocks per rank keep each query head with its key/value
    // head: a rank's heads/n query heads are groups of its kv_heads/n.
    groups_ = spec.heads / kv_heads;
    const bool input_ready = true;  // q, k and v share one column_input()
    LinearSpec column{spec.hidden, spec.hidden, spec.bias, LinearRole::kColumn, spec.init_std,
                      input_ready};
    LinearSpec kv_column = column;
    kv_column.out = kv_heads * head_dim_;
    q_ = register_module("q_proj", factory.linear(column));
    k_ = register_module("k_proj", factory.linear(kv_column));
    v_ = register_module("v_proj", factory.linear(kv_column));
    o_ = register_module("o_proj", factory.linear(LinearSpec{spec.hidden, spec.hidden, spec.bias,
                                                             LinearRole::kRow, spec.out_init_std}));
  }
  at::Tensor forward(const at::Tensor& input) override {
    // q, k and v share one prepared input (one collective, not three).
    const at::Tensor x = factory_->column_input(input);
    // Batch and sequence as the projections return them (a parallel factory
    // may hand its projections a gathered input and get back a block).
    at::Tensor q_out = q_->forward(x);
    const int64_t batch = q_out.size(0), seq = q_out.size(1);
    auto split_heads = [&](const at::Tensor& t) {
      return t.view({batch, seq, -1, head_dim_}).transpose(1, 2);  // [B, h, T, d]
    };
    at::Tensor q = split_heads(q_out);
    at::Tensor k = split_heads(k_->forward(x));
    at::Tensor v = split_heads(v_->forward(x));
    // Under sequence parallelism this rank's tokens sit at their global
    // positions, and the rotation follows them.
    SequenceStrategy* sequence = factory_->sequence();
    const at::Tensor positions = factory_->positions(seq);
    if (rope_theta_ > 0) {
      auto [cos, sin] = rope_angles(positions, head_dim_, rope_theta_, q.options());
      q = apply_rope(q, cos, sin);
      k = apply_rope(k, cos, sin);
    }
    if (AttentionCache* cache = current_attention_cache()) {
      // Inference: the cache keeps k and v per key/value head and attends
      // over each sequence's cached tokens (attention_cache.h).
      at::Tensor y = cache->attend(q, k, v);
      return o_->forward(y.transpose(1, 2).reshape({batch, seq, heads_ * head_dim_}));
    }
    if (groups_ > 1) {  // grouped-query attention: each k/v head serves its group
      k = k.repeat_interleave(groups_, 1);
      v = v.repeat_interleave(groups_, 1);
    }
    if (!causal_) {
      // The sequence strategies and the inference cache attend causally.
      KOLOS_CHECK_KIND(kConfig, sequence == nullptr && current_attention_cache() == nullptr,
                       "bidirectional (non-causal) attention, as model.name = \"vit\" uses, "
                       "runs without sequence parallelism only: the sequence strategies attend "
                       "causally; set parallel.sequence.size = 1");
      at::Tensor y = recompute_if_selected(&bidirectional_attention, {q, k, v});
      return o_->forward(y.transpose(1, 2).reshape({batch, seq, heads_ * head_dim_}));
    }
    at::Tensor y = sequence != nullptr
                       ? sequence->attention(q, k, v, positions)
                       : recompute_if_selected(&causal_attention, {q, k, v});  // [B, h, T, d]
    y = y.transpose(1, 2).reshape({batch, seq, heads_ * head_dim_});
    return o_->forward(y);
  }

 private:
  LayerFactory* factory_;
  int64_t heads_, head_dim_;
  double rope_theta_;
  bool causal_ = true;
  int64_t groups_ = 1;
  LayerPtr q_, k_, v_, o_;
};

class GeluMlp : public Layer {
 public:
  GeluMlp(LayerFactory& factory, const MlpSpec& spec)
      : approximate_(spec.activation == Activation::kGeluTanh ? "tanh" : "none") {
    up_ = register_module("up_proj", factory.linear(LinearSpec{spec.hidden, spec.inner, true,
                                                               LinearRole::kColumn, spec.init_std}));
    down_ = register_module(
        "down_proj",
        factory.linear(LinearSpec{spec.inner, spec.hidden, true, LinearRole::kRow, spec.out_init_std}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor h = up_->forward(x);
    if (kernel_gelu_ && h.device().is_cpu() && h.scalar_type() == at::kFloat && h.is_contiguous() &&
        !at::GradMode::is_enabled()) {
      // In place: the product's output is this layer's own.
      kernels::gelu_tanh(h.data_ptr<float>(), h.data_ptr<float>(), h.numel(),
                         at::get_num_threads());
      return down_->forward(h);
    }
    return down_->forward(torch::gelu(h, approximate_));
  }
  // Inference on the CPU: GELU's tanh form through kolos's kernel
  // (kolos/kernels/activation.h, one exponential instead of tanh), in
  // float32 without gradients; the exact (erf) form stays LibTorch's.
  bool pack_for_inference() override {
    kernel_gelu_ = std::string(approximate_) == "tanh";
    return false;
  }

 private:
  const char* approximate_;  // torch::gelu's "tanh" or "none" (exact, erf)
  bool kernel_gelu_ = false;
  LayerPtr up_, down_;
};

// The untied LM head of LayerFactory::lm_head: its weight lives in a table
// from embedding() (held, not registered) and is registered here under the
// same tensor and placement, so the head is cut like the tied one.
class UntiedLmHead : public Layer {
 public:
  UntiedLmHead(LayerFactory& factory, int64_t hidden, int64_t vocab, double init_std)
      : factory_(&factory), table_(factory.embedding(vocab, hidden, init_std)) {
    register_placed("weight", table_->named_parameters(false)["weight"],
                    table_->placements().at("weight"));
  }
  at::Tensor forward(const at::Tensor& x) override { return factory_->tied_logits(x, *table_); }
  // The table is held, not registered: no module walk reaches it.
  bool pack_for_inference() override {
    table_->pack_for_inference();
    return false;
  }

 private:
  LayerFactory* factory_;
  LayerPtr table_;
};

class SerialLayerFactory : public LayerFactory {
 public:
  std::string name() const override { return "serial"; }
};

// Sets the causal positions of [..., T, T] `x` (column > row) to `value` in
// place, a band of rows at a time: the columns right of a band are all
// masked (a fill, no mask), and only its [band, band] diagonal square needs a
// mask. No [T, T] mask exists at any time (16 MiB at 4096 tokens, 1 GiB at
// 32768, not divided by tensor or sequence parallelism).
void fill_causal_(at::Tensor& x, double value) {
  constexpr int64_t kBand = 256;
  const int64_t seq = x.size(-1);
  const int64_t band = std::min(kBand, seq);
  const at::Tensor square = at::ones({band, band}, x.options().dtype(at::kBool)).triu(1);
  for (int64_t row = 0; row < seq; row += band) {
    const int64_t rows = std::min(band, seq - row);
    at::Tensor slab = x.narrow(-2, row, rows);
    slab.narrow(-1, row, rows).masked_fill_(square.narrow(0, 0, rows).narrow(1, 0, rows), value);
    if (row + rows < seq) slab.narrow(-1, row + rows, seq - row - rows).fill_(value);
  }
}

// scores.masked_fill(causal mask, -inf) whose backward zeroes the same
// positions of the gradient: what it keeps for backward is nothing (plain
// masked_fill keeps its [T, T] mask, once per layer).
struct CausalMaskFill : public torch::autograd::Function<CausalMaskFill> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& scores) {
    at::Tensor out = scores.clone();
    fill_causal_(out, -std::numeric_limits<double>::infinity());
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    at::Tensor grad = grads[0].clone();
    fill_causal_(grad, 0.0);
    return {grad};
  }
};

}  // namespace

// softmax(QK^T / sqrt(d)) V with the causal mask, over [B, h, T, d] q, k, v:
// the part train.recompute = "selective" recomputes (its [B, h, T, T]
// scores and probabilities are most of what a block keeps).
at::Tensor causal_attention(const std::vector<at::Tensor>& qkv) {
  const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(3)));
  scores = CausalMaskFill::apply(scores);
  return torch::matmul(torch::softmax(scores, -1), v);
}

void LayerFactory::setup(const DeviceMesh& mesh, const RunConfig&) { mesh_ = &mesh; }

LayerPtr LayerFactory::linear(const LinearSpec& spec) { return std::make_shared<DenseLinear>(spec); }

LayerPtr LayerFactory::embedding(int64_t num, int64_t dim, double init_std) {
  return std::make_shared<DenseEmbedding>(num, dim, init_std);
}

LayerPtr LayerFactory::layer_norm(int64_t dim, double eps) {
  return std::make_shared<DenseLayerNorm>(dim, eps);
}

LayerPtr LayerFactory::rms_norm(int64_t dim, double eps) {
  return std::make_shared<DenseRmsNorm>(dim, eps);
}

LayerPtr LayerFactory::lm_head(int64_t hidden, int64_t vocab, double init_std) {
  return std::make_shared<UntiedLmHead>(*this, hidden, vocab, init_std);
}

LayerPtr LayerFactory::attention(const AttentionSpec& spec) {
  return std::make_shared<CausalSelfAttention>(*this, spec);
}

LayerPtr LayerFactory::mlp(const MlpSpec& spec) { return std::make_shared<GeluMlp>(*this, spec); }

at::Tensor LayerFactory::tied_logits(const at::Tensor& hidden, Layer& embedding) {
  if (const PackedLinear* table = embedding.packed_table()) return (*table)(hidden);
  return torch::matmul(hidden, embedding.named_parameters(false)["weight"].t());
}

at::Tensor LayerFactory::loss(const at::Tensor& logits, const at::Tensor& targets) {
  // In fp32 whatever the precision: a log-sum-exp over the vocabulary in
  // bf16 loses the loss's small differences (docs/precision.md).
  return torch::nn::functional::cross_entropy(logits.to(at::kFloat).reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

at::Tensor LayerFactory::normalize(const at::Tensor& x, double eps) {
  return torch::layer_norm(x, {x.size(-1)}, {}, {}, eps);
}

at::Tensor rms_normalize(const at::Tensor& x, const at::Tensor& mean_square, double eps) {
  return (x.to(at::kFloat) * torch::rsqrt(mean_square + eps)).to(x.scalar_type());
}

at::Tensor local_piece(const at::Tensor& global, const Placement& placement) {
  KOLOS_CHECK(global.sizes().vec() == placement.global_shape(), "tensor of shape ",
              global.sizes(), " is not the global tensor of ", placement.to_string());
  at::Tensor piece = global;
  for (int d = 0; d < placement.dim(); ++d) {
    piece = piece.narrow(d, placement.slice(d).offset, placement.slice(d).length);
  }
  // A copy, never a view: the piece must own its storage (ZeRO-3 frees it).
  if (!placement.has_padding()) return piece.clone(at::MemoryFormat::Contiguous);
  at::Tensor local = torch::zeros(placement.local_shape(), global.options());
  at::Tensor target = local;
  for (int d = 0; d < placement.dim(); ++d) target = target.narrow(d, 0, placement.slice(d).length);
  target.copy_(piece);
  return local;
}

std::shared_ptr<LayerFactory> make_serial_layer_factory() {
  return std::make_shared<SerialLayerFactory>();
}

}  // namespace kolos
