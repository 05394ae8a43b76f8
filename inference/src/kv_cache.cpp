#include "kolos/inference/kv_cache.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/inference/paged_attention.h"

namespace kolos::inference {

int64_t PagedKvCache::block_bytes(int64_t layers, int64_t block_size, int64_t kv_heads,
                                  int64_t head_dim, at::ScalarType dtype) {
  return 2 * layers * block_size * kv_heads * head_dim *
         static_cast<int64_t>(c10::elementSize(dtype));
}

PagedKvCache::PagedKvCache(int64_t layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
                           int64_t head_dim, at::ScalarType dtype)
    : num_blocks_(num_blocks), block_size_(block_size) {
  const auto options = torch::TensorOptions().dtype(dtype);
  for (int64_t l = 0; l < layers; ++l) {
    keys_.push_back(torch::zeros({num_blocks * block_size, kv_heads, head_dim}, options));
    values_.push_back(torch::zeros({num_blocks * block_size, kv_heads, head_dim}, options));
  }
}

void PagedKvCache::begin_step(const StepBatch& batch) {
  std::vector<int64_t> positions, write_rows;
  positions.reserve(batch.tokens.size());
  write_rows.reserve(batch.tokens.size());
  chunks_.clear();
  int64_t row = 0;
  for (const StepChunk& c : batch.chunks) {
    const int64_t context = c.start + c.length;
    KOLOS_CHECK(static_cast<int64_t>(c.blocks.size()) * block_size_ >= context,
                "a chunk's block table covers ", c.blocks.size() * block_size_,
                " positions, fewer than its ", context);
    std::vector<int64_t> rows(static_cast<size_t>(context));
    for (int64_t p = 0; p < context; ++p) {
      const int32_t block = c.blocks[static_cast<size_t>(p / block_size_)];
      KOLOS_CHECK(block >= 0 && block < num_blocks_, "KV block ", block, " outside the pool of ",
                  num_blocks_);
      rows[static_cast<size_t>(p)] = block * block_size_ + p % block_size_;
    }
    for (int64_t p = c.start; p < context; ++p) {
      positions.push_back(p);
      write_rows.push_back(rows[static_cast<size_t>(p)]);
    }
    ChunkView view;
    view.row = row;
    view.start = c.start;
    view.length = c.length;
    if (c.length > kInPlaceTokens) {
      view.context_rows = torch::tensor(rows, torch::kInt64);
      // Query i (position start + i) sees keys at positions <= start + i.
      view.mask = torch::arange(context, torch::kInt64).unsqueeze(0) >
                  torch::arange(c.start, context, torch::kInt64).unsqueeze(1);
    }
    view.rows = std::move(rows);
    chunks_.push_back(std::move(view));
    row += c.length;
  }
  positions_ = torch::tensor(positions, torch::kInt64);
  write_rows_ = torch::tensor(write_rows, torch::kInt64);
  layer_ = 0;
}

at::Tensor PagedKvCache::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  KOLOS_CHECK(layer_ < keys_.size(), "attention layer ", layer_, " of a cache for ", keys_.size(),
              " layers (begin_step() not called?)");
  at::Tensor& keys = keys_[layer_];
  at::Tensor& values = values_[layer_];
  ++layer_;
  // [1, kv_heads, T, d] -> [T, kv_heads, d] rows of the cache.
  keys.index_copy_(0, write_rows_, k[0].transpose(0, 1).to(keys.scalar_type()));
  values.index_copy_(0, write_rows_, v[0].transpose(0, 1).to(values.scalar_type()));
  const int64_t heads = q.size(1), kv_heads = k.size(1), head_dim = q.size(3);
  const int64_t groups = heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor out = torch::empty({heads, q.size(2), head_dim}, q.options().dtype(at::kFloat));
  attend_in_place(q, keys, values, out);
  for (const ChunkView& c : chunks_) {
    if (c.length <= kInPlaceTokens) continue;
    at::Tensor query = q[0].narrow(1, c.row, c.length);                     // [h, n, d]
    at::Tensor key = keys.index_select(0, c.context_rows).transpose(0, 1);  // [kvh, ctx, d]
    at::Tensor value = values.index_select(0, c.context_rows).transpose(0, 1);
    if (groups > 1) {  // grouped-query attention: each k/v head serves its group
      key = key.repeat_interleave(groups, 0);
      value = value.repeat_interleave(groups, 0);
    }
    at::Tensor scores = torch::matmul(query, key.transpose(1, 2)) * scale;  // [h, n, ctx]
    scores = scores.masked_fill(c.mask, -std::numeric_limits<double>::infinity());
    // Softmax in fp32 (as transformers' eager attention does for bf16).
    at::Tensor probs = torch::softmax(scores.to(at::kFloat), -1).to(value.scalar_type());
    out.narrow(1, c.row, c.length).copy_(torch::matmul(probs, value));  // [h, n, d]
  }
  return out.to(q.scalar_type()).unsqueeze(0);  // [1, h, T, d]
}

void PagedKvCache::attend_in_place(const at::Tensor& q, const at::Tensor& keys,
                                   const at::Tensor& values, at::Tensor& out) const {
  std::vector<PagedAttentionChunk> chunks;
  for (const ChunkView& c : chunks_) {
    if (c.length <= kInPlaceTokens) {
      chunks.push_back(PagedAttentionChunk{c.row, c.start, c.length, c.rows.data()});
    }
  }
  if (chunks.empty()) return;
  const at::Tensor query = q[0].to(at::kFloat).contiguous();  // [h, T, d]
  KOLOS_CHECK(keys.scalar_type() == at::kFloat || keys.scalar_type() == at::kBFloat16,
              "the KV cache holds ", keys.scalar_type(), ", not fp32 or bf16");
  PagedAttentionArgs args;
  args.q = query.data_ptr<float>();
  args.out = out.data_ptr<float>();
  args.heads = query.size(0);
  args.tokens = query.size(1);
  args.head_dim = query.size(2);
  args.keys = keys.data_ptr();
  args.values = values.data_ptr();
  args.kv_heads = keys.size(1);
  args.dtype = keys.scalar_type() == at::kFloat ? CacheDType::kFloat32 : CacheDType::kBFloat16;
  args.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(args.head_dim)));
  paged_attention(args, chunks.data(), chunks.size(), at::get_num_threads());
}

}  // namespace kolos::inference
