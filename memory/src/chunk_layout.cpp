#include "kolos/memory/chunk_layout.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

#include "kolos/core/error.h"

namespace kolos::memory {
namespace {

int64_t round_up(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

void check_alignment(int64_t alignment) {
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
    throw Error(detail::concat("chunk layout: alignment ", alignment,
                               " is not a positive power of two (use ", kVectorAlignment,
                               " for vector kernels or ", kDirectIoAlignment, " for direct I/O)"));
  }
}

void check_tensors(const std::vector<TensorSpec>& tensors) {
  for (const TensorSpec& t : tensors) {
    if (t.bytes < 0) {
      throw Error(detail::concat("chunk layout: tensor '", t.name, "' has ", t.bytes,
                                 " bytes; a tensor's size must be 0 or more"));
    }
  }
}

// The first tensor that does not fit into `chunk_bytes`, or tensors.size().
std::size_t first_oversized(const std::vector<TensorSpec>& tensors, int64_t chunk_bytes) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].bytes > chunk_bytes) return i;
  }
  return tensors.size();
}

[[noreturn]] void throw_oversized(const std::vector<TensorSpec>& tensors, std::size_t index,
                                  int64_t chunk_bytes, int64_t alignment) {
  const TensorSpec& t = tensors[index];
  throw Error(detail::concat("chunk layout: tensor '", t.name, "' (#", index, ") has ", t.bytes,
                             " bytes, more than the chunk size of ", chunk_bytes,
                             " bytes; tensors are never split across chunks, so the smallest "
                             "chunk size that holds every tensor is ",
                             smallest_chunk_bytes(tensors, alignment), " bytes (alignment ",
                             alignment, ")"));
}

// The packing rule, shared by pack() and the search so that both count the
// same waste. `place` is called once per tensor with (chunk, offset).
template <typename Place>
std::size_t walk(const std::vector<TensorSpec>& tensors, int64_t chunk_bytes, int64_t alignment,
                 Place&& place) {
  std::size_t chunks = 0;
  int64_t end = 0;  // end of the last tensor in the current chunk
  int group = 0;    // its group
  for (const TensorSpec& t : tensors) {
    int64_t offset = round_up(end, alignment);
    if (chunks == 0 || t.group != group || offset + t.bytes > chunk_bytes) {
      ++chunks;
      offset = 0;
    }
    place(chunks - 1, offset);
    end = offset + t.bytes;
    group = t.group;
  }
  return chunks;
}

int64_t payload(const std::vector<TensorSpec>& tensors) {
  int64_t sum = 0;
  for (const TensorSpec& t : tensors) sum += t.bytes;
  return sum;
}

}  // namespace

int64_t smallest_chunk_bytes(const std::vector<TensorSpec>& tensors, int64_t alignment) {
  check_alignment(alignment);
  int64_t largest = 0;
  for (const TensorSpec& t : tensors) largest = std::max(largest, t.bytes);
  return std::max(alignment, round_up(largest, alignment));
}

ChunkLayout pack(const std::vector<TensorSpec>& tensors, int64_t chunk_bytes, int64_t alignment) {
  check_alignment(alignment);
  check_tensors(tensors);
  if (chunk_bytes <= 0 || chunk_bytes % alignment != 0) {
    throw Error(detail::concat("chunk layout: chunk size ", chunk_bytes,
                               " bytes is not a positive multiple of the alignment ", alignment,
                               " (the next one up is ",
                               std::max(alignment, round_up(chunk_bytes, alignment)), ")"));
  }
  const std::size_t bad = first_oversized(tensors, chunk_bytes);
  if (bad != tensors.size()) throw_oversized(tensors, bad, chunk_bytes, alignment);

  ChunkLayout layout;
  layout.chunk_bytes = chunk_bytes;
  layout.alignment = alignment;
  layout.slots.reserve(tensors.size());
  std::size_t i = 0;
  walk(tensors, chunk_bytes, alignment, [&](std::size_t chunk, int64_t offset) {
    const int64_t bytes = tensors[i++].bytes;
    layout.slots.push_back({chunk, offset, bytes});
    if (chunk == layout.chunk_used.size()) layout.chunk_used.push_back(0);
    layout.chunk_used[chunk] = offset + bytes;
  });
  layout.wasted_bytes = layout.total_bytes() - payload(tensors);
  return layout;
}

std::string ChunkSearchResult::describe() const {
  const double total = static_cast<double>(num_chunks) * static_cast<double>(chunk_bytes);
  const double percent = total > 0 ? 100.0 * static_cast<double>(wasted_bytes) / total : 0.0;
  char text[320];
  std::snprintf(text, sizeof text,
                "chunk %lld B (%.2f MiB): %zu chunks, %lld B wasted (%.2f%%); best of %lld "
                "sizes in [%lld, %lld] step %lld",
                static_cast<long long>(chunk_bytes), static_cast<double>(chunk_bytes) / 1048576.0,
                num_chunks, static_cast<long long>(wasted_bytes), percent,
                static_cast<long long>(candidates), static_cast<long long>(min_bytes),
                static_cast<long long>(max_bytes), static_cast<long long>(step_bytes));
  return text;
}

std::ostream& operator<<(std::ostream& out, const ChunkSearchResult& result) {
  return out << result.describe();
}

ChunkSearchResult search_chunk_bytes(const std::vector<TensorSpec>& tensors, int64_t min_bytes,
                                     int64_t max_bytes, int64_t step_bytes, int64_t alignment) {
  check_alignment(alignment);
  check_tensors(tensors);
  if (step_bytes <= 0 || min_bytes <= 0 || max_bytes < min_bytes || min_bytes % alignment != 0 ||
      step_bytes % alignment != 0) {
    throw Error(detail::concat(
        "chunk size search: range [", min_bytes, ", ", max_bytes, "] step ", step_bytes,
        " is not searchable; min and step must be positive multiples of the alignment ", alignment,
        " and max at least min"));
  }
  const int64_t smallest = smallest_chunk_bytes(tensors, alignment);
  if (smallest > max_bytes) {
    std::size_t bad = 0;  // the largest tensor (smallest > max_bytes means there is one)
    for (std::size_t i = 1; i < tensors.size(); ++i) {
      if (tensors[i].bytes > tensors[bad].bytes) bad = i;
    }
    throw Error(detail::concat(
        "chunk size search: tensor '", tensors[bad].name, "' (#", bad, ") has ", tensors[bad].bytes,
        " bytes, more than the largest size searched (", max_bytes,
        " bytes); tensors are never split, so search up to at least ", smallest, " bytes"));
  }

  ChunkSearchResult best;
  best.payload_bytes = payload(tensors);
  best.min_bytes = min_bytes;
  best.max_bytes = max_bytes;
  best.step_bytes = step_bytes;
  bool found = false;
  // The first candidate that holds the largest tensor; every size below it
  // would fail to pack.
  int64_t start = min_bytes;
  if (start < smallest) start += (smallest - start + step_bytes - 1) / step_bytes * step_bytes;
  for (int64_t size = start; size <= max_bytes; size += step_bytes) {
    ++best.candidates;
    const std::size_t chunks = walk(tensors, size, alignment, [](std::size_t, int64_t) {});
    const int64_t waste = static_cast<int64_t>(chunks) * size - best.payload_bytes;
    // Strictly less: on a tie the smaller size, found first, stays.
    if (!found || waste < best.wasted_bytes) {
      found = true;
      best.chunk_bytes = size;
      best.wasted_bytes = waste;
      best.num_chunks = chunks;
    }
  }
  if (!found) {
    throw Error(detail::concat("chunk size search: no size in [", min_bytes, ", ", max_bytes,
                               "] step ", step_bytes, " is at least ", smallest,
                               " bytes, the smallest chunk that holds every tensor"));
  }
  return best;
}

}  // namespace kolos::memory
