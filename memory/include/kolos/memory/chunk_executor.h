// Executing a placement plan with real bytes: a compute arena that cannot
// exceed the plan's budget, and a lower tier (NVMe slots or host buffers)
// that holds every chunk not in the arena.
//
// The planner (placement.h) decides, before anything runs, which chunks
// enter and leave the compute tier at each step; the executor carries that
// out: before step i it evicts (writing back only chunks the caller marked
// dirty, since a clean chunk's tier copy is still valid), waits for the
// step's loads, and starts the plan's prefetches without waiting for them,
// so that their reads run while the caller computes step i.
//
// The arena is host memory obtained from the kernel per chunk (mmap); a
// released buffer stays mapped for the next allocation of its size while
// the mapped bytes are within the budget, and goes back to the kernel
// (munmap) when room for another size is needed, so that the process's
// resident memory for the arena never passes the budget and a steady
// iteration faults in no new pages: the compute tier of a CPU run. Device
// memory as the compute tier is not implemented; the budget logic does not
// depend on where the bytes are.
//
// Torch-free; not thread-safe (one caller drives the steps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolos/memory/nvme_store.h"
#include "kolos/memory/placement.h"

namespace kolos::memory {

// A hard byte budget over aligned buffers. allocate() beyond the budget
// throws kolos::Error (an internal error: the executor only allocates what
// a replayed plan says fits). A buffer's bytes are unspecified when it is
// allocated (zeros when freshly mapped, a released buffer's otherwise).
// Released buffers are kept mapped for reuse by size, with live and kept
// bytes together never above the budget.
class ComputeArena {
 public:
  // `alignment`: a power of two; buffers start at a multiple of it and their
  // sizes are rounded up to it, and the rounded size is what counts.
  ComputeArena(int64_t budget_bytes, int64_t alignment);
  ~ComputeArena();
  ComputeArena(const ComputeArena&) = delete;
  ComputeArena& operator=(const ComputeArena&) = delete;

  std::byte* allocate(int64_t bytes);
  // `bytes` as given to allocate().
  void release(std::byte* buffer, int64_t bytes) noexcept;

  int64_t budget_bytes() const noexcept { return budget_; }
  int64_t alignment() const noexcept { return alignment_; }
  int64_t live_bytes() const noexcept { return live_; }
  int64_t peak_bytes() const noexcept { return peak_; }
  // Live bytes plus released buffers kept for reuse: at most the budget.
  int64_t mapped_bytes() const noexcept { return live_ + kept_; }
  // Buffers taken from the kernel (mmap calls) so far.
  int64_t maps() const noexcept { return maps_; }

 private:
  int64_t rounded(int64_t bytes) const noexcept;
  std::byte* map(int64_t size);

  int64_t budget_ = 0;
  int64_t alignment_ = 0;
  int64_t live_ = 0;
  int64_t peak_ = 0;
  int64_t kept_ = 0;
  int64_t maps_ = 0;
  // Released buffers still mapped: (rounded size, buffer), most recent last.
  std::vector<std::pair<int64_t, std::byte*>> free_;
};

// Where chunks live while they are not in the compute tier.
enum class LowerTier { kNvme, kHost };
const char* to_string(LowerTier tier);

struct ExecutorOptions {
  LowerTier tier = LowerTier::kNvme;
  // Used when tier is kNvme; the store has one slot per chunk, each the
  // largest chunk's size.
  NvmeOptions nvme;
  // Fills chunk `id`'s `bytes` bytes once, at construction, before they go
  // to the lower tier. Empty: every chunk starts zeroed.
  std::function<void(ChunkId id, std::byte* dst, int64_t bytes)> init;
  // scratch[id]: chunk `id` has no copy in the lower tier (ZeRO-3: a
  // parameter chunk another rank owns, which the caller fills from its
  // owner whenever a step needs it). It enters the arena with unspecified
  // bytes and leaves it without a write; it takes no NVMe slot or host
  // buffer, `init` is not called for it, and mark_dirty(), read_chunk() and
  // write_chunk() refuse it. Empty: no scratch chunks.
  std::vector<bool> scratch;
  // fresh[s]: chunks trace step s overwrites whole before it reads them (a
  // gradient chunk zeroed where an iteration first uses it); each must be
  // one of step s's chunks. From a chunk's last use before such a step up
  // to that step its bytes are dead: a load for the step reads nothing
  // (the buffer's bytes are unspecified), an eviction in between writes
  // nothing, and a chunk the plan loads only for such steps has no tier
  // copy at all: no NVMe slot or host buffer, no call of `init`, and
  // read_chunk() and write_chunk() refuse it (under ZeRO, gradient chunks
  // of other ranks' indices that stay resident from their first use to
  // their reduction). Empty, or one list per step.
  std::vector<std::vector<ChunkId>> fresh;
};

// What moved, for tests and logs.
struct ExecutorStats {
  int64_t bytes_read = 0;     // lower tier -> arena (loads, prefetches, the initial set)
  int64_t bytes_written = 0;  // arena -> lower tier (dirty evictions and flushes)
  int64_t clean_drops = 0;    // evictions that wrote nothing (scratch and dead ones too)
  int64_t bytes_not_read = 0;     // loads for a fresh use, which read nothing
  int64_t bytes_not_written = 0;  // dirty evictions of dead bytes, which wrote nothing
  int64_t iterations = 0;     // passes over the trace whose last step has begun
};

class ChunkExecutor {
 public:
  // Checks the plan against the trace with replay() (a plan that could
  // exceed its budget is refused here, not found out half-way), checks that
  // every chunk's bytes are a multiple of the lower tier's alignment (so
  // the arena's rounded bytes are the plan's bytes), opens the lower tier
  // and writes every chunk's initial contents into it. The trace and the
  // plan are copied. Throws kolos::Error naming what is wrong.
  ChunkExecutor(const AccessTrace& trace, const Plan& plan, const ExecutorOptions& options);
  // Waits for reads in flight; dirty chunks are NOT written back (call
  // flush() first to keep them); the NVMe store's folder is removed.
  ~ChunkExecutor();
  ChunkExecutor(const ChunkExecutor&) = delete;
  ChunkExecutor& operator=(const ChunkExecutor&) = delete;

  // Runs step i's moves; steps come in trace order, and after the last one
  // step 0 starts the next iteration. Each iteration starts from the plan's
  // initial set: at step 0 chunks left resident by the previous iteration
  // that the plan does not hold initially are evicted (written back if
  // dirty) and the initial chunks are loaded. Then: the step's evictions,
  // its loads (waited for), the wait for earlier prefetches of chunks it
  // needs, and its prefetches (started, not waited for). Afterwards every
  // chunk of step i is in the arena and chunk() gives its buffer. Throws
  // kolos::Error for a step out of order or a failed transfer; after a
  // failed transfer the executor refuses every further call but read_chunk.
  void begin_step(std::size_t step);

  // The arena buffer of chunk `id` (its trace bytes long), which the current
  // step must need; valid until the next begin_step(). Throws kolos::Error
  // otherwise.
  std::byte* chunk(ChunkId id);
  // The current step wrote chunk `id`: its next eviction writes it back
  // (unless its bytes are dead by then: ExecutorOptions::fresh).
  void mark_dirty(ChunkId id);

  // Writes every dirty resident chunk with a tier copy whose bytes are not
  // dead back to the lower tier and waits; they stay resident, now clean.
  void flush();

  // Copies chunk `id`'s current bytes (trace bytes long) into `dst` (bytes
  // that are dead, ExecutorOptions::fresh, come out unspecified), from
  // the arena when it is resident (after its read in flight, if any) or
  // from the lower tier otherwise (also when its read into the arena
  // failed: the tier's copy is then the current one). Any alignment of
  // `dst` works.
  void read_chunk(ChunkId id, void* dst);

  // Replaces chunk `id`'s bytes (trace bytes long) with `src`'s, wherever
  // the chunk is: in the arena (after its read in flight; it becomes dirty)
  // or in the lower tier (written and waited for). Loading a checkpoint
  // into chunks. Any alignment of `src` works.
  void write_chunk(ChunkId id, const void* src);

  const ComputeArena& arena() const noexcept { return *arena_; }
  const ExecutorStats& stats() const noexcept { return stats_; }
  LowerTier tier() const noexcept { return tier_; }
  bool resident(ChunkId id) const;
  // Whether chunk `id` has a copy in the lower tier: not scratch, and
  // either never fresh or loaded by the plan for a use that reads it.
  bool has_tier_copy(ChunkId id) const;
  // Bytes the lower tier holds for this trace: the host buffers, or the
  // NVMe slots (one per chunk with a tier copy).
  int64_t lower_tier_bytes() const noexcept { return lower_tier_bytes_; }
  // The NVMe store, or null for the host tier.
  const NvmeStore* nvme_store() const noexcept { return store_.get(); }

 private:
  struct Chunk;

  void check_usable(const char* what) const;
  void check_id(ChunkId id, const char* what) const;
  void wait_read(ChunkId id);
  // Loads and evictions happen before step `at` runs (prefetches while it
  // runs); whether the chunk's bytes are dead is judged from there.
  void start_read(ChunkId id, std::size_t at, bool wait);
  void evict(const std::vector<ChunkId>& ids, std::size_t at);
  // Writes `ids` (resident, dirty) to the lower tier, waits, marks them clean.
  void write_back(const std::vector<ChunkId>& ids);
  void load(const std::vector<ChunkId>& ids, std::size_t at);
  void prefetch(const std::vector<ChunkId>& ids, std::size_t at);
  std::string where() const;

  AccessTrace trace_;
  Plan plan_;
  LowerTier tier_ = LowerTier::kNvme;
  int64_t alignment_ = 0;
  std::vector<std::vector<bool>> needs_;  // needs_[step][chunk]
  // dead_[step][chunk]: the chunk's next use at or after `step` (in the
  // next iteration if none is left in this one) is fresh.
  std::vector<std::vector<bool>> dead_;
  std::unique_ptr<ComputeArena> arena_;
  // Declared after the arena, so destroyed before it: its I/O threads are
  // joined before the buffers they may still write into are unmapped.
  std::unique_ptr<NvmeStore> store_;
  std::vector<Chunk> chunks_;
  AlignedBuffer bounce_;  // read_chunk() from NVMe into an unaligned buffer
  ExecutorStats stats_;
  int64_t lower_tier_bytes_ = 0;
  std::size_t next_step_ = 0;
  std::size_t current_step_ = 0;
  bool in_step_ = false;
  bool broken_ = false;
};

}  // namespace kolos::memory
