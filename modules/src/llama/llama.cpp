#include "kolos/modules/llama.h"

#include <torch/torch.h>

#include <cmath>
#include <tuple>

#include "common/model_checks.h"
#include "common/pre_norm_block.h"
#include "kolos/core/aux_loss.h"
#include "kolos/core/error.h"
#include "kolos/core/experts.h"
#include "kolos/core/mesh.h"

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
  // `width`: the hidden width (0: c.ffn_hidden).
  SwiGluMlp(LayerFactory& factory, const ModelConfig& c, int64_t width = 0)
      : factory_(&factory) {
    const int64_t inner = width > 0 ? width : c.ffn_hidden;
    const LinearSpec column{c.hidden,   inner,               /*bias=*/false, LinearRole::kColumn,
                            c.init_std, /*input_ready=*/true};
    gate_ = register_module("gate_proj", factory.linear(column));
    up_ = register_module("up_proj", factory.linear(column));
    down_ = register_module("down_proj", factory.linear(LinearSpec{inner, c.hidden, false,
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

// Layers held only as a named list ("0", "1", ...): the experts.
class LayerList : public Layer {
 public:
  void add(LayerPtr layer) { add(std::to_string(layers_.size()), std::move(layer)); }
  void add(const std::string& name, LayerPtr layer) {
    layers_.push_back(register_module(name, std::move(layer)));
  }
  const std::vector<LayerPtr>& layers() const { return layers_; }
  at::Tensor forward(const at::Tensor&) override {
    KOLOS_CHECK(false, "a layer list is not run as one layer");
    return {};
  }

 private:
  std::vector<LayerPtr> layers_;
};

// A mixture of SwiGLU experts (Mixtral's sparse MoE block): a router scores
// every token for every expert (softmax over `experts`), the token goes to
// its top_k, weighted by their scores renormalised over the top_k; dropless
// unless capacity_factor > 0, which keeps each expert's first
// ceil(capacity_factor * tokens * top_k / experts) assignments (first
// choices of every token before second choices, tokens in order) and drops
// the rest (their weight is lost, not given to the others). Every expert
// runs every step, on no rows when it received none, so each holds a
// gradient and a tensor-parallel expert's collectives run on every rank.
//
// The Switch/GShard load-balancing loss aux_loss_coef * experts *
// sum_{k,e} f[k][e] * P[e] (f: the fraction of tokens whose k-th choice is
// e; P: the mean router probability of e; Hugging Face's
// load_balancing_loss_func per micro-batch) and the z-loss z_loss_coef *
// mean(logsumexp(logits)^2) train the router through with_aux_loss.
//
// router = "sigmoid" scores each expert with sigmoid(logit) (DeepSeek-V3);
// the top_k are chosen on those scores and renormalised, and P in the
// load-balancing loss is the mean of each token's scores normalised to sum
// to 1. shared_experts > 0 adds one SwiGLU MLP of width shared_experts x
// ffn_hidden that every token goes through (DeepSeek's shared experts),
// replicated along ep and split by tensor rank as a dense MLP.
//
// bias_update_rate > 0 (DeepSeek-V3's auxiliary-loss-free balancing) keeps
// a per-expert bias, a buffer named kRouterBiasBuffer (experts.h): the
// top_k are chosen on scores + bias, weighted by the scores alone; the
// engine moves the bias after every step (update_router_biases).
class MoeMlp : public Layer {
 public:
  MoeMlp(LayerFactory& factory, const ModelConfig& c, int64_t block)
      : block_(block),
        sigmoid_(c.router == "sigmoid"),
        top_k_(c.top_k),
        aux_coef_(c.aux_loss_coef),
        z_coef_(c.z_loss_coef),
        capacity_factor_(c.capacity_factor) {
    router_ = register_module("router", factory.linear(LinearSpec{c.hidden, c.experts, false,
                                                                  LinearRole::kReplicated,
                                                                  c.init_std}));
    // Every expert is drawn, in order, so the weights are the serial
    // model's whatever the ep size; a rank keeps its own (experts.h), under
    // their global numbers.
    shard_ = local_experts(factory.mesh(), c.experts);
    auto experts = std::make_shared<LayerList>();
    for (int64_t e = 0; e < c.experts; ++e) {
      auto expert = std::make_shared<SwiGluMlp>(factory, c);
      if (e >= shard_.first && e < shard_.first + shard_.count) {
        experts->add(std::to_string(e), std::move(expert));
      }
    }
    if (shard_.group != nullptr) experts->hold_apart_along(AxisSet{expert_axis()});
    // The balancing bias: state the engine updates after each step and
    // checkpoints (kRouterBiasBuffer), not a trained parameter.
    if (c.bias_update_rate > 0) {
      bias_ = register_buffer(kRouterBiasBuffer, torch::zeros({c.experts}));
    }
    experts_ = register_module("experts", experts);
    if (c.shared_experts > 0) {
      shared_ = register_module(
          "shared", std::make_shared<SwiGluMlp>(factory, c, c.shared_experts * c.ffn_hidden));
    }
  }

  at::Tensor forward(const at::Tensor& input) override {
    const int64_t hidden = input.size(-1);
    const at::Tensor x = input.reshape({-1, hidden});
    const int64_t n = x.size(0);
    const auto& experts = experts_->layers();
    const int64_t e_count = shard_.total;
    const at::Tensor logits = router_->forward(x).to(at::kFloat);  // [N, E]
    const at::Tensor scores = sigmoid_ ? torch::sigmoid(logits) : torch::softmax(logits, -1);
    // Each token's scores as a distribution over the experts (the balancing loss's P).
    const at::Tensor probs = sigmoid_ ? scores / scores.sum(-1, /*keepdim=*/true) : scores;
    // The choice is made on scores + the balancing bias (when kept), the
    // weights from the scores themselves.
    const at::Tensor ranked = bias_.defined() ? scores + bias_.to(scores.device()) : scores;
    const at::Tensor choice = std::get<1>(ranked.topk(top_k_, -1));  // [N, k]
    const at::Tensor top = scores.gather(-1, choice);
    const at::Tensor weights = top / top.sum(-1, /*keepdim=*/true);
    // [k, N, E]: assignment (k-th choice of token t) -> expert, one-hot.
    const at::Tensor one_hot =
        torch::one_hot(choice.t(), e_count).to(at::kFloat);  // [k, N, E]
    at::Tensor kept = torch::ones({top_k_, n}, torch::kBool);
    if (capacity_factor_ > 0) {
      const int64_t capacity = static_cast<int64_t>(
          std::ceil(capacity_factor_ * static_cast<double>(n * top_k_) / e_count));
      // Position of each assignment in its expert's queue, 1-based.
      const at::Tensor position =
          (one_hot.reshape({top_k_ * n, e_count}).cumsum(0) * one_hot.reshape({top_k_ * n, e_count}))
              .sum(-1)
              .reshape({top_k_, n});
      kept = position <= capacity;
    }
    dropped_ = (top_k_ * n) - kept.sum().item<int64_t>();
    // The kept assignments sorted by expert: their tokens and slots.
    const at::Tensor choice_t = choice.t();  // [k, N]
    std::vector<at::Tensor> tokens, slots;
    std::vector<int64_t> counts;
    for (int64_t e = 0; e < e_count; ++e) {
      const at::Tensor hit = (choice_t == e).logical_and(kept).nonzero();  // [m, 2]: (k, token)
      slots.push_back(hit.select(1, 0));
      tokens.push_back(hit.select(1, 1));
      counts.push_back(hit.size(0));
    }
    const at::Tensor rows = torch::cat(tokens), slot = torch::cat(slots);
    const at::Tensor y = run_experts(x.index_select(0, rows), counts, shard_,
                                     [&experts](int64_t j, const at::Tensor& in) {
                                       return experts[j]->forward(in);
                                     });
    const at::Tensor w = weights.index({rows, slot}).unsqueeze(-1);
    at::Tensor out = torch::zeros_like(x).index_add(0, rows, y * w.to(y.scalar_type()));
    if (shared_) out = out + shared_->forward(x);
    at::Tensor aux;
    if (aux_coef_ > 0) {
      const at::Tensor fraction = one_hot.mean(1);  // [k, E]
      aux = aux_coef_ * static_cast<double>(e_count) * (fraction * probs.mean(0)).sum();
    }
    if (z_coef_ > 0) {
      const at::Tensor z = z_coef_ * torch::logsumexp(logits, -1).pow(2).mean();
      aux = aux.defined() ? aux + z : z;
    }
    if (at::GradMode::is_enabled()) {
      record_routing(block_, counts, dropped_, aux.defined() ? aux.item<double>() : 0.0);
    }
    out = out.reshape(input.sizes());
    return aux.defined() ? with_aux_loss(out, aux) : out;
  }

 private:
  int64_t block_;  // the model's block index (routing figures)
  bool sigmoid_;
  int64_t top_k_;
  double aux_coef_, z_coef_, capacity_factor_;
  at::Tensor bias_;  // [E] float32, the balancing bias (undefined when not kept)
  int64_t dropped_ = 0;
  ExpertShard shard_;
  LayerPtr router_;
  std::shared_ptr<LayerList> experts_;
  LayerPtr shared_;  // shared experts, or null
};

// Hugging Face's LLaMA initialises every linear layer N(0, init_std),
// without GPT-2's residual scaling.
LayerPtr llama_block(LayerFactory& factory, const ModelConfig& c, int64_t index) {
  AttentionSpec attention{c.hidden, c.heads, c.init_std, c.init_std};
  attention.kv_heads = c.kv_heads;
  attention.bias = false;
  attention.rope_theta = c.rope_theta;
  return std::make_shared<PreNormBlock>(PreNormBlock::Parts{
      factory.rms_norm(c.hidden, c.norm_eps), factory.attention(attention),
      factory.rms_norm(c.hidden, c.norm_eps),
      is_moe_block(c, index) ? LayerPtr(std::make_shared<MoeMlp>(factory, c, index))
                             : LayerPtr(std::make_shared<SwiGluMlp>(factory, c))});
}

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
  check_heads(c);
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
    model->add_block("h." + std::to_string(i), llama_block(factory, c, i), /*repeated=*/true);
  }
  model->add_block("head", std::make_shared<LlamaHead>(factory, c));
  model->set_loss([&factory](const at::Tensor& logits, const at::Tensor& targets) {
    return factory.loss(logits, targets);
  });
  return model;
}

}  // namespace kolos::modules
