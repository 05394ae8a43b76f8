// Attention of short chunks (decoding steps) read in place from a paged KV
// cache: no gather of a sequence's rows. Torch-free (plain pointers).
//
// Each cached row (one position: every key/value head, contiguous) is read
// once per token, for all the heads of a work item together; scores, the
// softmax and the sums are fp32 whatever the cache holds. Work items are
// (chunk, a run of key/value heads), over OpenMP threads; the heads are cut
// into runs only when there are too few chunks to keep every thread busy.
// The vector loops (dot products, sums and the softmax with its exp) use
// AVX-512 for the dot products and sums where the CPU has it and head_dim
// is a multiple of 16, AVX2 with FMA where it has those and head_dim is a
// multiple of 8 (cpuid), and portable C++ otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kolos::inference {

enum class CacheDType { kFloat32, kBFloat16 };

struct PagedAttentionChunk {
  int64_t token = 0;              // its first token's index in q and out
  int64_t start = 0;              // the position of that token
  int64_t length = 0;             // its tokens; token i sees positions [0, start + i]
  const int64_t* rows = nullptr;  // [start + length] cache rows, position order
};

struct PagedAttentionArgs {
  const float* q = nullptr;  // [heads, tokens, head_dim]
  float* out = nullptr;      // [heads, tokens, head_dim]: each chunk's tokens written
  int64_t heads = 0, tokens = 0, head_dim = 0;
  // [rows, kv_heads, head_dim]; query head h reads key/value head
  // h / (heads / kv_heads) (grouped-query attention).
  const void* keys = nullptr;
  const void* values = nullptr;
  int64_t kv_heads = 0;
  CacheDType dtype = CacheDType::kFloat32;
  float scale = 1.0f;  // applied to q.k (1 / sqrt(head_dim))
};

// out = softmax(q.k * scale) v for every token of every chunk, on up to
// `threads` threads (0: OpenMP's default).
void paged_attention(const PagedAttentionArgs& args, const PagedAttentionChunk* chunks,
                     size_t count, int threads = 0);

// Whether paged_attention runs vector loops (AVX2, or AVX-512 where
// head_dim allows) on this CPU for `head_dim`.
bool paged_attention_uses_avx2(int64_t head_dim);

}  // namespace kolos::inference
