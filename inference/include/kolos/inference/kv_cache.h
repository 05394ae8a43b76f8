// The paged KV cache of one rank: per layer, a key and a value tensor of
// [num_blocks * block_size, kv_heads, head_dim] (this rank's key/value
// heads), addressed through each sequence's block table: position p of a
// sequence lives in row table[p / block_size] * block_size + p % block_size.
//
// It is the model's AttentionCache (kolos/core/attention_cache.h) during a
// step's forward: the attention layers hand it q, k and v of the step's
// tokens (every scheduled chunk of every sequence, concatenated); it writes
// k and v into their rows and attends each chunk's queries over its
// sequence's cached keys, causally. A short chunk (a decoding step's one
// token) is attended in place: a loop over its sequence's rows, scores and
// softmax in fp32, in parallel over chunks and key/value heads. A longer
// chunk (a prefill) gathers its sequence's rows (index_select) and runs a
// matmul for the scores, a masked softmax in fp32 and a matmul for the
// output (costs: docs/inference.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "kolos/core/attention_cache.h"

namespace kolos::inference {

// One step's batch as every rank sees it (rank 0 broadcasts it).
struct StepChunk {
  int64_t start = 0;   // position of its first token
  int64_t length = 0;  // its tokens in the step
  bool sample = false;
  std::vector<int32_t> blocks;  // covers [0, start + length)
};
struct StepBatch {
  std::vector<int64_t> tokens;  // every chunk's tokens, in chunk order
  std::vector<StepChunk> chunks;
};

class PagedKvCache : public AttentionCache {
 public:
  PagedKvCache(int64_t layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
               int64_t head_dim, at::ScalarType dtype);

  // Bytes of one block over every layer, keys and values.
  static int64_t block_bytes(int64_t layers, int64_t block_size, int64_t kv_heads, int64_t head_dim,
                             at::ScalarType dtype);

  // Prepares a step: positions, the cache rows the step's tokens go to, the
  // rows each chunk reads, and its causal mask. The next attend() is layer 0.
  void begin_step(const StepBatch& batch);

  at::Tensor positions() const override { return positions_; }
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) override;

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }

 private:
  // A chunk of at most this many tokens is attended in place.
  static constexpr int64_t kInPlaceTokens = 8;
  struct ChunkView {
    int64_t row = 0, start = 0, length = 0;
    std::vector<int64_t> rows;  // [start + length] cache rows, position order
    at::Tensor context_rows;    // the same, for a gathered chunk
    at::Tensor mask;            // [length, start + length], true where masked (gathered)
  };
  // Attends the in-place chunks of out [heads, tokens, head_dim] (fp32).
  void attend_in_place(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                       at::Tensor& out) const;
  int64_t num_blocks_, block_size_;
  std::vector<at::Tensor> keys_, values_;  // [layer]
  at::Tensor positions_;                   // [tokens]
  at::Tensor write_rows_;                  // [tokens]
  std::vector<ChunkView> chunks_;
  size_t layer_ = 0;
};

}  // namespace kolos::inference
