// Chunk layout: where each tensor of a model lives inside fixed-size chunks.
//
// The memory tiers move whole chunks, never single tensors: one transfer per
// chunk keeps the number of I/O operations small and lets each one be large
// and aligned (direct I/O to NVMe needs 4096-byte offsets and lengths). A
// tensor is never split across two chunks, so a kernel always sees it in one
// piece; the price is the unused tail of a chunk that the next tensor does
// not fit into, and the padding that aligns each tensor's offset. That price
// is the "waste" that search_chunk_bytes minimises.
//
// Torch-free: a tensor is a name and a byte count, in model order (the order
// the forward pass first touches them), so that a chunk holds tensors that
// are needed together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace kolos::memory {

// Offsets aligned for vector kernels (a cache line, an AVX-512 register).
inline constexpr int64_t kVectorAlignment = 64;
// Offsets aligned for O_DIRECT reads and writes (the logical block size of
// every NVMe device kolos targets).
inline constexpr int64_t kDirectIoAlignment = 4096;

struct TensorSpec {
  std::string name;
  int64_t bytes = 0;
  // Tensors of different groups never share a chunk (e.g. gradients
  // reduced over different ranks): a tensor whose group differs from the
  // one before it starts a new chunk.
  int group = 0;
};

// Where one tensor went: its chunk and its byte offset inside that chunk.
struct TensorSlot {
  std::size_t chunk = 0;
  int64_t offset = 0;
  int64_t bytes = 0;
};

struct ChunkLayout {
  int64_t chunk_bytes = 0;
  int64_t alignment = 0;
  // One per tensor, in the order given to pack().
  std::vector<TensorSlot> slots;
  // One per chunk: the end of its last tensor (padding between tensors
  // included, the unused tail not).
  std::vector<int64_t> chunk_used;
  // Bytes of all chunks that hold no tensor: alignment padding plus each
  // chunk's unused tail, the last chunk's included (it is allocated whole).
  // Equals num_chunks() * chunk_bytes - the sum of the tensors' bytes.
  int64_t wasted_bytes = 0;

  std::size_t num_chunks() const { return chunk_used.size(); }
  int64_t total_bytes() const { return static_cast<int64_t>(num_chunks()) * chunk_bytes; }
};

// Packs `tensors` in order into chunks of `chunk_bytes`: each tensor starts
// at the next `alignment`-aligned offset of the current chunk, or at offset 0
// of a new chunk when it does not fit or its group differs from the tensor
// before it. Throws kolos::Error when a tensor is
// larger than a chunk (naming it, its bytes, the chunk size and the smallest
// chunk size that holds every tensor), when `alignment` is not a power of two
// or `chunk_bytes` not a multiple of it, or when a tensor's bytes are negative.
ChunkLayout pack(const std::vector<TensorSpec>& tensors, int64_t chunk_bytes,
                 int64_t alignment = kVectorAlignment);

// The smallest chunk size that holds every tensor: the largest tensor rounded
// up to `alignment` (at least `alignment`).
int64_t smallest_chunk_bytes(const std::vector<TensorSpec>& tensors,
                             int64_t alignment = kVectorAlignment);

struct ChunkSearchResult {
  int64_t chunk_bytes = 0;
  int64_t wasted_bytes = 0;
  std::size_t num_chunks = 0;
  int64_t payload_bytes = 0;  // sum of the tensors' bytes
  int64_t candidates = 0;     // sizes tried (those at least the largest tensor)
  int64_t min_bytes = 0, max_bytes = 0, step_bytes = 0;  // the range searched

  // One line: "chunk 1048576 B (1.00 MiB): 12 chunks, 3456 B wasted (0.03%);
  // best of 17 sizes in [min, max] step s".
  std::string describe() const;
};
std::ostream& operator<<(std::ostream& out, const ChunkSearchResult& result);

// Tries chunk sizes min_bytes, min_bytes + step_bytes, ... up to max_bytes and
// returns the one whose packing wastes the fewest bytes; on a tie the smaller
// size wins (fewer bytes per transfer, finer placement). Sizes below the
// largest tensor are skipped. Throws kolos::Error when the range is empty or
// malformed (min, step not multiples of `alignment`, step <= 0, max < min) or
// when no size in it holds the largest tensor (naming the tensor and the
// smallest size that would). Cost: one packing pass per candidate size.
ChunkSearchResult search_chunk_bytes(const std::vector<TensorSpec>& tensors, int64_t min_bytes,
                                     int64_t max_bytes, int64_t step_bytes,
                                     int64_t alignment = kVectorAlignment);

}  // namespace kolos::memory
