#include <torch/torch.h>

#include <cmath>

#include "kolos/core/error.h"
#include "kolos/core/layer_factory.h"

namespace kolos {

at::Tensor Layer::register_placed(const std::string& name, at::Tensor tensor,
                                  Placement placement) {
  KOLOS_CHECK(tensor.sizes().vec() == placement.local_shape(), "parameter `", name,
              "` has shape ", tensor.sizes(), " but its placement ", placement.to_string(),
              " needs a local shape of ", c10::IntArrayRef(placement.local_shape()));
  placements_[name] = std::move(placement);
  return register_parameter(name, std::move(tensor));
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
    return torch::nn::functional::linear(x, weight_, bias_);
  }

 private:
  at::Tensor weight_, bias_;
};

class DenseEmbedding : public Layer {
 public:
  DenseEmbedding(int64_t num, int64_t dim, double init_std) {
    weight_ = register_placed("weight", torch::randn({num, dim}) * init_std,
                              Placement::replicated({num, dim}));
  }
  at::Tensor forward(const at::Tensor& ids) override { return torch::embedding(weight_, ids); }

 private:
  at::Tensor weight_;
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

// Causal self-attention with separate q/k/v projections (column) and an
// output projection (row), so tensor-parallel factories split heads simply.
class CausalSelfAttention : public Layer {
 public:
  CausalSelfAttention(LayerFactory& factory, const AttentionSpec& spec)
      : factory_(&factory),
        heads_(factory.local_heads(spec.heads)),
        head_dim_(spec.hidden / spec.heads) {
    KOLOS_CHECK_KIND(kConfig, spec.hidden % spec.heads == 0, "hidden size ", spec.hidden,
                     " is not divisible by the ", spec.heads, " attention heads");
    LinearSpec column{spec.hidden, spec.hidden, true, LinearRole::kColumn, spec.init_std,
                      /*input_ready=*/true};
    q_ = register_module("q_proj", factory.linear(column));
    k_ = register_module("k_proj", factory.linear(column));
    v_ = register_module("v_proj", factory.linear(column));
    o_ = register_module("o_proj", factory.linear(LinearSpec{spec.hidden, spec.hidden, true,
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
      return t.view({batch, seq, heads_, head_dim_}).transpose(1, 2);  // [B, h, T, d]
    };
    at::Tensor q = split_heads(q_out);
    at::Tensor k = split_heads(k_->forward(x));
    at::Tensor v = split_heads(v_->forward(x));
    at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(head_dim_));
    at::Tensor mask = torch::ones({seq, seq}, torch::kBool).triu(1);
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
    at::Tensor y = torch::matmul(torch::softmax(scores, -1), v);  // [B, h, T, d]
    y = y.transpose(1, 2).reshape({batch, seq, heads_ * head_dim_});
    return o_->forward(y);
  }

 private:
  LayerFactory* factory_;
  int64_t heads_, head_dim_;
  LayerPtr q_, k_, v_, o_;
};

class GeluMlp : public Layer {
 public:
  GeluMlp(LayerFactory& factory, const MlpSpec& spec) {
    up_ = register_module("up_proj", factory.linear(LinearSpec{spec.hidden, spec.inner, true,
                                                               LinearRole::kColumn, spec.init_std}));
    down_ = register_module(
        "down_proj",
        factory.linear(LinearSpec{spec.inner, spec.hidden, true, LinearRole::kRow, spec.out_init_std}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return down_->forward(torch::gelu(up_->forward(x), "tanh"));
  }

 private:
  LayerPtr up_, down_;
};

class SerialLayerFactory : public LayerFactory {
 public:
  std::string name() const override { return "serial"; }
};

}  // namespace

void LayerFactory::setup(const DeviceMesh& mesh, const RunConfig&) { mesh_ = &mesh; }

LayerPtr LayerFactory::linear(const LinearSpec& spec) { return std::make_shared<DenseLinear>(spec); }

LayerPtr LayerFactory::embedding(int64_t num, int64_t dim, double init_std) {
  return std::make_shared<DenseEmbedding>(num, dim, init_std);
}

LayerPtr LayerFactory::layer_norm(int64_t dim, double eps) {
  return std::make_shared<DenseLayerNorm>(dim, eps);
}

LayerPtr LayerFactory::attention(const AttentionSpec& spec) {
  return std::make_shared<CausalSelfAttention>(*this, spec);
}

LayerPtr LayerFactory::mlp(const MlpSpec& spec) { return std::make_shared<GeluMlp>(*this, spec); }

at::Tensor LayerFactory::tied_logits(const at::Tensor& hidden, Layer& embedding) {
  return torch::matmul(hidden, embedding.named_parameters(false)["weight"].t());
}

at::Tensor LayerFactory::loss(const at::Tensor& logits, const at::Tensor& targets) {
  // In fp32 whatever the precision: a log-sum-exp over the vocabulary in
  // bf16 loses the loss's small differences (docs/precision.md).
  return torch::nn::functional::cross_entropy(logits.to(at::kFloat).reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
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
