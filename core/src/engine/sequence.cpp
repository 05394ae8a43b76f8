// The sequence role's shared pieces (kolos/core/sequence.h) and the layer
// factory's access to it.
#include "kolos/core/sequence.h"

#include <torch/torch.h>

#include "kolos/core/attention_cache.h"
#include "kolos/core/layer_factory.h"
#include "kolos/core/mesh.h"

namespace kolos {
namespace {
thread_local bool sequence_bypassed = false;
thread_local AttentionCache* attention_cache = nullptr;
}  // namespace

AttentionCache* current_attention_cache() { return attention_cache; }
AttentionCacheScope::AttentionCacheScope(AttentionCache* cache) : previous_(attention_cache) {
  attention_cache = cache;
}
AttentionCacheScope::~AttentionCacheScope() { attention_cache = previous_; }

void SequenceStrategy::setup(const DeviceMesh& mesh, const RunConfig&) {
  group_ = mesh.group(Axis::kSP).get();
  rank_ = mesh.coord(Axis::kSP);
}

int64_t SequenceStrategy::size() const { return group_ != nullptr ? group_->size() : 1; }

SequenceBypassScope::SequenceBypassScope() : previous_(sequence_bypassed) {
  sequence_bypassed = true;
}
SequenceBypassScope::~SequenceBypassScope() { sequence_bypassed = previous_; }
bool SequenceBypassScope::active() { return sequence_bypassed; }

SequenceStrategy* LayerFactory::sequence() const {
  if (sequence_ == nullptr || sequence_->size() == 1 || sequence_bypassed) return nullptr;
  return sequence_.get();
}

at::Tensor LayerFactory::positions(int64_t length) const {
  // Inference: each token's position in its own sequence (attention_cache.h).
  if (attention_cache != nullptr) return attention_cache->positions();
  SequenceStrategy* s = sequence();
  if (s == nullptr) return torch::arange(length, torch::kInt64);
  return s->local_positions(length * s->size());
}

}  // namespace kolos
