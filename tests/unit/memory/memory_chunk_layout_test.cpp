// Chunk packing and the chunk size search. The invariants are checked on
// hand-made layouts (exact offsets) and on random models with a fixed seed.
#include "kolos/memory/chunk_layout.h"

#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "kolos/core/error.h"

namespace kolos::memory {
namespace {

std::vector<TensorSpec> random_tensors(std::mt19937_64& rng, std::size_t count, int64_t max_bytes) {
  std::uniform_int_distribution<int64_t> size(0, max_bytes);
  std::vector<TensorSpec> out;
  // Runs of tensors in one of two groups (dense and experts).
  int group = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (rng() % 8 == 0) group = 1 - group;
    out.push_back({"t" + std::to_string(i), size(rng), group});
  }
  return out;
}

// Every property a layout must have, checked from the slots alone.
void expect_valid(const std::vector<TensorSpec>& tensors, const ChunkLayout& layout) {
  ASSERT_EQ(layout.slots.size(), tensors.size());
  int64_t payload = 0;
  std::vector<int64_t> end(layout.num_chunks(), 0);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorSlot& s = layout.slots[i];
    SCOPED_TRACE("tensor " + std::to_string(i));
    payload += tensors[i].bytes;
    EXPECT_EQ(s.bytes, tensors[i].bytes);
    ASSERT_LT(s.chunk, layout.num_chunks());
    EXPECT_EQ(s.offset % layout.alignment, 0);
    EXPECT_LE(s.offset + s.bytes, layout.chunk_bytes);
    if (i > 0) {
      const TensorSlot& prev = layout.slots[i - 1];
      // In model order, chunks filled one after another, no overlap.
      EXPECT_TRUE(s.chunk == prev.chunk || s.chunk == prev.chunk + 1);
      if (s.chunk == prev.chunk) {
        EXPECT_GE(s.offset, prev.offset + prev.bytes);
        EXPECT_EQ(tensors[i].group, tensors[i - 1].group);  // one group per chunk
      } else if (tensors[i].group == tensors[i - 1].group) {
        EXPECT_EQ(s.offset, 0);
        // A new chunk only when the tensor did not fit after the previous
        // one, or its group changed.
        const int64_t next =
            (prev.offset + prev.bytes + layout.alignment - 1) / layout.alignment * layout.alignment;
        EXPECT_GT(next + s.bytes, layout.chunk_bytes);
      } else {
        EXPECT_EQ(s.offset, 0);
      }
    } else {
      EXPECT_EQ(s.chunk, 0u);
      EXPECT_EQ(s.offset, 0);
    }
    end[s.chunk] = std::max(end[s.chunk], s.offset + s.bytes);
  }
  for (std::size_t c = 0; c < layout.num_chunks(); ++c) {
    EXPECT_EQ(layout.chunk_used[c], end[c]) << "chunk " << c;
  }
  EXPECT_EQ(layout.wasted_bytes,
            static_cast<int64_t>(layout.num_chunks()) * layout.chunk_bytes - payload);
}

TEST(ChunkLayout, HandMadeOffsetsAndWaste) {
  const std::vector<TensorSpec> tensors = {{"a", 100}, {"b", 50}, {"c", 200}, {"d", 10}};
  const ChunkLayout layout = pack(tensors, 256, 64);
  ASSERT_EQ(layout.num_chunks(), 3u);
  EXPECT_EQ(layout.slots[0].chunk, 0u);
  EXPECT_EQ(layout.slots[0].offset, 0);
  EXPECT_EQ(layout.slots[1].chunk, 0u);
  EXPECT_EQ(layout.slots[1].offset, 128);  // 100 rounded up to 64
  EXPECT_EQ(layout.slots[2].chunk, 1u);    // 192 + 200 > 256
  EXPECT_EQ(layout.slots[2].offset, 0);
  EXPECT_EQ(layout.slots[3].chunk, 2u);  // 256 + 10 > 256
  EXPECT_EQ(layout.chunk_used, (std::vector<int64_t>{178, 200, 10}));
  // 28 padding + 78 tail, 56 tail, 246 tail.
  EXPECT_EQ(layout.wasted_bytes, 3 * 256 - 360);
  expect_valid(tensors, layout);
}

// A tensor whose group differs from the one before it starts a new chunk
// (experts, reduced over fewer ranks than the dense weights, never share a
// chunk with them), and the search counts that chunk's tail as waste.
TEST(ChunkLayout, AGroupChangeStartsANewChunk) {
  const std::vector<TensorSpec> tensors = {
      {"a", 64, 0}, {"expert.0", 64, 1}, {"expert.1", 64, 1}, {"b", 64, 0}};
  const ChunkLayout layout = pack(tensors, 256, 64);
  ASSERT_EQ(layout.num_chunks(), 3u);
  EXPECT_EQ(layout.slots[0].chunk, 0u);
  EXPECT_EQ(layout.slots[1].chunk, 1u);
  EXPECT_EQ(layout.slots[1].offset, 0);
  EXPECT_EQ(layout.slots[2].chunk, 1u);
  EXPECT_EQ(layout.slots[2].offset, 64);
  EXPECT_EQ(layout.slots[3].chunk, 2u);
  EXPECT_EQ(layout.wasted_bytes, 3 * 256 - 4 * 64);
  expect_valid(tensors, layout);
  const ChunkSearchResult best = search_chunk_bytes(tensors, 64, 256, 64);
  EXPECT_EQ(best.num_chunks, 4u);  // 64-byte chunks: one per tensor, no waste
  EXPECT_EQ(best.chunk_bytes, 64);
  EXPECT_EQ(best.wasted_bytes, 0);
}

TEST(ChunkLayout, DirectIoAlignmentCountsPaddingAsWaste) {
  const std::vector<TensorSpec> tensors = {{"a", 1}, {"b", 1}, {"c", 4096}};
  const ChunkLayout layout = pack(tensors, 8192, kDirectIoAlignment);
  EXPECT_EQ(layout.slots[1].offset, 4096);
  EXPECT_EQ(layout.slots[2].chunk, 1u);
  EXPECT_EQ(layout.wasted_bytes, 2 * 8192 - 4098);
  expect_valid(tensors, layout);
}

TEST(ChunkLayout, RandomModelsKeepEveryInvariant) {
  std::mt19937_64 rng(20261202);
  for (int round = 0; round < 200; ++round) {
    const int64_t alignment = round % 2 == 0 ? kVectorAlignment : kDirectIoAlignment;
    auto tensors = random_tensors(rng, 1 + rng() % 60, 20000);
    const int64_t smallest = smallest_chunk_bytes(tensors, alignment);
    const int64_t chunk = smallest + alignment * static_cast<int64_t>(rng() % 8);
    SCOPED_TRACE("round " + std::to_string(round));
    expect_valid(tensors, pack(tensors, chunk, alignment));
  }
}

TEST(ChunkLayout, TensorLargerThanChunkIsRefusedWithTheNumbers) {
  const std::vector<TensorSpec> tensors = {{"wte", 1000}, {"h.0.attn.w", 5000}, {"ln", 10}};
  try {
    pack(tensors, 4096, 64);
    FAIL() << "expected kolos::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'h.0.attn.w'"), std::string::npos) << what;
    EXPECT_NE(what.find("5000 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("4096 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("5056 bytes"), std::string::npos) << what;  // 5000 rounded up to 64
  }
  EXPECT_EQ(smallest_chunk_bytes(tensors, 64), 5056);
  EXPECT_NO_THROW(pack(tensors, 5056, 64));
}

TEST(ChunkLayout, MalformedArgumentsAreRefused) {
  const std::vector<TensorSpec> tensors = {{"a", 10}};
  EXPECT_THROW(pack(tensors, 256, 48), Error);  // alignment not a power of two
  EXPECT_THROW(pack(tensors, 200, 64), Error);  // chunk not a multiple of the alignment
  EXPECT_THROW(pack(tensors, 0, 64), Error);
  EXPECT_THROW(pack({{"neg", -1}}, 256, 64), Error);
}

// The reference: pack every size and keep the least waste, smaller on ties.
std::pair<int64_t, int64_t> brute_force(const std::vector<TensorSpec>& tensors, int64_t lo,
                                        int64_t hi, int64_t step, int64_t alignment) {
  int64_t best = -1, best_waste = 0;
  for (int64_t size = lo; size <= hi; size += step) {
    if (size < smallest_chunk_bytes(tensors, alignment)) continue;
    const int64_t waste = pack(tensors, size, alignment).wasted_bytes;
    if (best < 0 || waste < best_waste) {
      best = size;
      best_waste = waste;
    }
  }
  return {best, best_waste};
}

TEST(ChunkSearch, PicksTheMinimumFoundByBruteForce) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 60; ++round) {
    auto tensors = random_tensors(rng, 1 + rng() % 80, 30000);
    const int64_t lo = 64 * static_cast<int64_t>(1 + rng() % 200);
    const int64_t step = 64 * static_cast<int64_t>(1 + rng() % 4);
    const int64_t hi = smallest_chunk_bytes(tensors) + 64 * static_cast<int64_t>(rng() % 600);
    if (hi < lo) continue;
    SCOPED_TRACE("round " + std::to_string(round));
    const auto [size, waste] = brute_force(tensors, lo, hi, step, 64);
    if (size < 0) {
      EXPECT_THROW(search_chunk_bytes(tensors, lo, hi, step), Error);
      continue;
    }
    const ChunkSearchResult r = search_chunk_bytes(tensors, lo, hi, step);
    EXPECT_EQ(r.chunk_bytes, size);
    EXPECT_EQ(r.wasted_bytes, waste);
    EXPECT_EQ(r.num_chunks, pack(tensors, size).num_chunks());
  }
}

TEST(ChunkSearch, TieGoesToTheSmallerSize) {
  // 2 chunks of 128 and 1 chunk of 256 both waste nothing.
  const std::vector<TensorSpec> tensors = {{"a", 128}, {"b", 128}};
  const ChunkSearchResult r = search_chunk_bytes(tensors, 64, 512, 64);
  EXPECT_EQ(r.chunk_bytes, 128);
  EXPECT_EQ(r.wasted_bytes, 0);
  EXPECT_EQ(r.candidates, 7);  // 128..512; 64 cannot hold a tensor
  std::ostringstream text;
  text << r;
  EXPECT_NE(text.str().find("chunk 128 B"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("0 B wasted"), std::string::npos) << text.str();
}

TEST(ChunkSearch, RangeBelowTheLargestTensorIsRefusedWithTheNumbers) {
  const std::vector<TensorSpec> tensors = {{"small", 100}, {"lm_head", 9000}};
  try {
    search_chunk_bytes(tensors, 1024, 8192, 1024);
    FAIL() << "expected kolos::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'lm_head'"), std::string::npos) << what;
    EXPECT_NE(what.find("9000 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("8192 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("9024 bytes"), std::string::npos) << what;
  }
  EXPECT_THROW(search_chunk_bytes(tensors, 1000, 20000, 1024), Error);  // min not aligned
  EXPECT_THROW(search_chunk_bytes(tensors, 1024, 512, 1024), Error);    // max < min
  EXPECT_THROW(search_chunk_bytes(tensors, 1024, 20480, 0), Error);
}

}  // namespace
}  // namespace kolos::memory
