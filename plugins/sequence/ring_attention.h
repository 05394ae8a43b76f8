// Ring attention: causal attention over a sequence spread over the ranks of
// a sequence-parallel group, with zigzag placement for causal balance
// (docs/sequence-parallel.md, "Ring attention").
//
// Each rank holds q, k, v for its own tokens. K/V blocks travel around the
// group (rank r sends to r+1 and receives from r-1, asynchronously, while it
// computes on the block it has); an online softmax (running max and sum)
// folds the blocks into the output. The backward is a second ring: K/V
// travel again and the dK/dV accumulators travel with them back to their
// owners. It recomputes the block scores from the saved output and
// log-sum-exp as flash attention does, so memory is O(T_local), never T x T.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace kolos {

namespace comm {
class ProcessGroup;
}

// Causal attention over a sequence spread over `group` (the sp ranks).
// q, k, v: this rank's [B, h, T_local, d], one dtype (float32, bfloat16 or
// float16; the arithmetic is float32 whatever the inputs). positions: int64
// [T_local], the global positions of this rank's tokens, in any order. A key
// attends to a query iff pos_k <= pos_q, so the mask follows the positions
// whatever the placement. Every rank of `group` calls it with the same B, h,
// T_local, d and dtype, and `group` outlives the backward. Softmax scale
// 1/sqrt(d). Differentiable in q, k and v; the backward is collective too
// (every rank of `group` runs it, as after a loss that depends on every
// rank's output).
//
// The rows of each rank are cut into tiles where the positions jump, of at
// most half the rows (zigzag placement: its two chunks) and at most
// detail::kDefaultMaxTileRows rows, so that one tile pair's scores are all
// it holds beyond O(T_local) tensors. A tile pair whose keys all follow all
// its queries is skipped; a pair whose keys all precede its queries is
// computed without a mask. A query that no key may attend to (no key at or
// before its position anywhere in the group) gets a zero output and zero
// gradients.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& positions, comm::ProcessGroup& group);

// Zigzag placement for causal balance: the sequence cut into 2*sp chunks;
// rank r holds chunks r and 2*sp-1-r. Returns the global positions (int64,
// ascending) rank r holds of a sequence of length `seq`. Requires
// seq % (2*sp) == 0 (throws kolos::ConfigError naming the nearest valid
// lengths otherwise; callers pad or refuse before).
at::Tensor zigzag_positions(int64_t seq, int64_t sp, int64_t rank);

// What ring_attention computed in this process since the last reset, for
// the balance measurements (the counts are exact; they do not depend on
// timing). A tile pair is one (query tile, key tile) product; elements are
// its query rows x key rows, per batch row and head.
struct RingAttentionStats {
  int64_t forward_pairs = 0;          // tile pairs computed by forwards
  int64_t forward_pairs_skipped = 0;  // tile pairs skipped (keys all after queries)
  int64_t forward_elements = 0;       // score elements of the computed pairs
  int64_t backward_pairs = 0;
  int64_t backward_pairs_skipped = 0;
  int64_t backward_elements = 0;
  // Time spent computing (not waiting for blocks), for the balance
  // measurements; never for assertions. Wall time, and the calling thread's
  // CPU time: with one intra-op thread (the tests run so) that is the work
  // itself, whether or not the rank had a core to itself; with more it
  // leaves out the pool's threads.
  double forward_compute_s = 0;
  double backward_compute_s = 0;
  double forward_compute_cpu_s = 0;
  double backward_compute_cpu_s = 0;
};
RingAttentionStats ring_attention_stats();
void reset_ring_attention_stats();

namespace detail {
// Largest tile, in rows. 512: a tile pair's float32 scores are then at most
// B x h x 1 MiB, while products of 512 rows still run near the matmul's
// peak on CPU. Tests lower it to exercise many tiles with short sequences.
// Returns the previous value; values < 1 are taken as 1. Set it on every
// rank of a group alike (the counts, not the results, depend on it).
constexpr int64_t kDefaultMaxTileRows = 512;
int64_t set_ring_attention_max_tile_rows(int64_t rows);
}  // namespace detail

}  // namespace kolos
