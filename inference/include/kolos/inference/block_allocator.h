// The paged KV cache's block pool: fixed-size blocks of `block_size` tokens,
// identified by index, reference-counted so that sequences may share a
// block (a forked sequence, a common prefix). Owned by rank 0's scheduler;
// the other ranks only see the block tables it broadcasts.
//
// Not thread-safe; torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace kolos::inference {

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_blocks() - num_free(); }

  // A free block with reference count 1, or -1 when none is free.
  int32_t allocate();
  // One more holder of `block` (which must be in use).
  void share(int32_t block);
  // Drops one reference; the block is free again when none is left.
  void release(int32_t block);
  int32_t ref_count(int32_t block) const;

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
};

// Blocks needed to hold `tokens` tokens.
inline int64_t blocks_for(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

}  // namespace kolos::inference
