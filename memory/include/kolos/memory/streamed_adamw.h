// AdamW over fp32 parameters and optimizer states that live on the NVMe
// tier: each chunk's param, exp_avg and exp_avg_sq are three NvmeStore
// slots, streamed through a bounded set of host buffers and updated by the
// fused CPU kernel (kolos/kernels/adamw.h) while neighbouring chunks are
// read and written back.
//
// The kernel is element-wise, so updating the chunks one by one gives the
// bits adamw_step_fp32 gives on the whole arrays held in memory.
//
// Pipeline: while chunk i is updated, chunks i+1 .. i+prefetch are being read
// and chunk i-1 is being written back. A buffer set (three aligned buffers of
// slot_bytes, one per array) is taken for a chunk when its read is queued
// and given back when its write has completed, so at most prefetch + 2 sets
// exist: host memory = (prefetch + 2) x 3 x slot_bytes. The sets are kept
// between steps (allocated on first use, freed with the object).
#pragma once

#include <cstdint>
#include <memory>

#include "kolos/kernels/adamw.h"
#include "kolos/memory/nvme_store.h"

namespace kolos::memory {

struct StreamedAdamWOptions {
  // fp32 elements of the parameter (and of each optimizer state).
  int64_t numel = 0;
  // Elements per chunk; the last chunk holds the remainder. chunk_numel x 4
  // bytes must fit in one slot of the store.
  int64_t chunk_numel = 0;
  // Chunk c keeps param, exp_avg and exp_avg_sq in slots
  // first_slot + 3c, first_slot + 3c + 1 and first_slot + 3c + 2.
  int64_t first_slot = 0;
  // Chunks read ahead of the one being updated (>= 0).
  int prefetch = 1;
  // OpenMP threads of the fused kernel (0: omp_get_max_threads()).
  int kernel_threads = 0;
};

class StreamedAdamW {
 public:
  // Checks the options against the store (slots in range, chunk fits a
  // slot); each failure is a kolos::Error naming the values and what would
  // work. The store must outlive this object.
  StreamedAdamW(NvmeStore& store, const StreamedAdamWOptions& options);
  ~StreamedAdamW();
  StreamedAdamW(const StreamedAdamW&) = delete;
  StreamedAdamW& operator=(const StreamedAdamW&) = delete;

  // Slots a store needs for `numel` elements in chunks of `chunk_numel`.
  static int64_t slots_needed(int64_t numel, int64_t chunk_numel);

  // Writes the three arrays (numel elements each, any alignment) into the
  // store, and reads them back out. Both stream through the same buffer
  // sets as step(). An I/O error is a kolos::Error naming the chunk.
  void upload(const float* param, const float* exp_avg, const float* exp_avg_sq);
  void download(float* param, float* exp_avg, float* exp_avg_sq);

  // One AdamW step over all chunks (config.step is the 1-based step count
  // for bias correction). `grad` holds numel fp32 gradients in host memory.
  void step(const float* grad, const kernels::AdamWConfig& config);
  // As above with one gradient pointer per chunk (chunks() of them, each
  // with chunk_numel(c) elements).
  void step(const float* const* chunk_grads, const kernels::AdamWConfig& config);

  // Any failure (an I/O error, a slot never uploaded, a kernel error) waits
  // for the I/O still in flight and throws kolos::Error naming the chunk;
  // chunks before it have then been updated and chunks after it have not,
  // so the states are to be restored from a checkpoint, not stepped again.

  int64_t chunks() const noexcept;
  int64_t chunk_numel(int64_t chunk) const;
  // The bound on buffer sets: prefetch + 2, and the host bytes they take.
  int64_t max_buffer_sets() const noexcept;
  int64_t max_host_bytes() const noexcept;
  // Buffer sets allocated so far (each is three allocate_aligned() calls),
  // and the most that were held by chunks in flight at one time.
  int64_t buffer_sets_allocated() const noexcept;
  int64_t peak_buffer_sets_in_use() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolos::memory
