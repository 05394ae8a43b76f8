// The hook through which inference runs the training model with a KV cache.
//
// The model zoo's attention layer (LayerFactory::attention) and
// LayerFactory::positions() ask for the calling thread's current
// AttentionCache. When there is none (training), nothing changes. When an
// inference engine installs one (AttentionCacheScope) around a forward:
//   - positions() returns the cache's positions, one per token of the
//     forward's (flattened, batch 1) input, so learned position embeddings
//     and rotary embeddings see each token's position in its own sequence;
//   - each attention layer computes q, k and v as in training (rotary
//     embedding applied, key/value heads not yet repeated for grouped-query
//     attention) and hands them to attend(), which stores k and v in the
//     cache and returns the attention output over every cached token of each
//     token's sequence.
// So every layers plugin whose attention is the core's (serial, tp1d) serves
// inference with the same weights and the same forward as training.
//
// Torch-free but for at::Tensor: kolos/inference implements it.
#pragma once

#include <ATen/core/Tensor.h>

namespace kolos {

class AttentionCache {
 public:
  virtual ~AttentionCache() = default;
  // Positions (int64, [tokens]) of the tokens of the current forward.
  virtual at::Tensor positions() const = 0;
  // Called once per attention layer and forward, in the model's order, on
  // the forward's thread. q: [1, heads, tokens, d] (this rank's heads), k
  // and v: [1, kv_heads, tokens, d]. Returns [1, heads, tokens, d].
  virtual at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) = 0;
};

// The calling thread's cache, or null (training).
AttentionCache* current_attention_cache();

// Installs `cache` as the calling thread's cache for the scope's lifetime.
class AttentionCacheScope {
 public:
  explicit AttentionCacheScope(AttentionCache* cache);
  ~AttentionCacheScope();
  AttentionCacheScope(const AttentionCacheScope&) = delete;
  AttentionCacheScope& operator=(const AttentionCacheScope&) = delete;

 private:
  AttentionCache* previous_;
};

}  // namespace kolos
