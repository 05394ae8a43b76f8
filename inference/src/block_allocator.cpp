#include "kolos/inference/block_allocator.h"

#include "kolos/core/error.h"

namespace kolos::inference {

BlockAllocator::BlockAllocator(int64_t num_blocks) {
  KOLOS_CHECK(num_blocks >= 0 && num_blocks < (int64_t{1} << 31), "a KV block pool of ", num_blocks,
              " blocks");
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  free_.reserve(refs_.size());
  // Block 0 on top of the stack: the first allocations are 0, 1, 2, ...
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int32_t BlockAllocator::allocate() {
  if (free_.empty()) return -1;
  const int32_t block = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(block)] = 1;
  return block;
}

void BlockAllocator::share(int32_t block) {
  KOLOS_CHECK(block >= 0 && block < num_blocks() && refs_[static_cast<size_t>(block)] > 0,
              "KV block ", block, " is not in use; only a block in use can be shared");
  ++refs_[static_cast<size_t>(block)];
}

void BlockAllocator::release(int32_t block) {
  KOLOS_CHECK(block >= 0 && block < num_blocks() && refs_[static_cast<size_t>(block)] > 0,
              "KV block ", block, " released but not in use");
  if (--refs_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

int32_t BlockAllocator::ref_count(int32_t block) const {
  KOLOS_CHECK(block >= 0 && block < num_blocks(), "no KV block ", block);
  return refs_[static_cast<size_t>(block)];
}

}  // namespace kolos::inference
