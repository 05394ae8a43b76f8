#include "kolos/memory/chunk_executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <future>
#include <utility>

#include "kolos/core/error.h"

namespace kolos::memory {

// ---------------------------------------------------------------- arena

ComputeArena::ComputeArena(int64_t budget_bytes, int64_t alignment)
    : budget_(budget_bytes), alignment_(alignment) {
  if (budget_bytes <= 0) {
    throw Error(detail::concat("compute arena: a budget of ", budget_bytes, " bytes; give > 0"));
  }
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
    throw Error(detail::concat("compute arena: alignment ", alignment, " is not a power of two"));
  }
}

ComputeArena::~ComputeArena() {
  for (const auto& [size, buffer] : free_) ::munmap(buffer, static_cast<std::size_t>(size));
}

int64_t ComputeArena::rounded(int64_t bytes) const noexcept {
  return (bytes + alignment_ - 1) / alignment_ * alignment_;
}

std::byte* ComputeArena::allocate(int64_t bytes) {
  KOLOS_CHECK(bytes > 0, "compute arena: allocation of ", bytes, " bytes");
  const int64_t size = rounded(bytes);
  // The one place the budget is enforced: every buffer of the compute tier
  // comes from here, so no sequence of moves can hold more than the budget.
  KOLOS_CHECK(live_ + size <= budget_, "internal error: compute arena asked for ", size,
              " bytes with ", live_, " of its ", budget_,
              " bytes live; the plan was replayed within the budget, so the executor moved "
              "something the plan did not");
  std::byte* buffer = nullptr;
  for (std::size_t i = free_.size(); i-- > 0;) {
    if (free_[i].first != size) continue;
    buffer = free_[i].second;
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
    kept_ -= size;
    break;
  }
  if (buffer == nullptr) {
    // Room among the mapped bytes: kept buffers of other sizes go back to
    // the kernel, the oldest first.
    std::size_t dropped = 0;
    while (live_ + kept_ + size > budget_ && dropped < free_.size()) {
      ::munmap(free_[dropped].second, static_cast<std::size_t>(free_[dropped].first));
      kept_ -= free_[dropped].first;
      ++dropped;
    }
    free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(dropped));
    buffer = map(size);
  }
  live_ += size;
  if (live_ > peak_) peak_ = live_;
  return buffer;
}

// Pages straight from the kernel, so that the arena's memory is its own
// (not in malloc's free lists) and goes back to the kernel when dropped;
// page alignment is what mmap gives, a larger alignment is cut out of a
// larger mapping.
std::byte* ComputeArena::map(int64_t size) {
  const auto page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  const int64_t extra = alignment_ > page ? alignment_ : 0;
  void* p = ::mmap(nullptr, static_cast<std::size_t>(size + extra), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    throw Error(detail::concat("compute arena: mmap of ", size,
                               " bytes failed: ", std::strerror(err), " (", live_, " of ", budget_,
                               " budget bytes live)"));
  }
  ++maps_;
  auto* base = static_cast<std::byte*>(p);
  std::byte* start = base;
  if (extra > 0) {
    const auto address = reinterpret_cast<std::uintptr_t>(base);
    const auto a = static_cast<std::uintptr_t>(alignment_);
    start = base + ((a - address % a) % a);
    const auto head = static_cast<std::size_t>(start - base);
    const auto tail = static_cast<std::size_t>(extra) - head;
    if (head > 0) ::munmap(base, head);
    if (tail > 0) ::munmap(start + size, tail);
  }
  return start;
}

void ComputeArena::release(std::byte* buffer, int64_t bytes) noexcept {
  if (buffer == nullptr) return;
  const int64_t size = rounded(bytes);
  live_ -= size;
  // Kept for the next allocation of its size: live and kept bytes were
  // within the budget with it live, so they are without it.
  try {
    free_.emplace_back(size, buffer);
    kept_ += size;
  } catch (...) {
    ::munmap(buffer, static_cast<std::size_t>(size));
  }
}

const char* to_string(LowerTier tier) {
  switch (tier) {
    case LowerTier::kNvme:
      return "nvme";
    case LowerTier::kHost:
      return "host";
  }
  return "?";
}

// ---------------------------------------------------------------- executor

struct ChunkExecutor::Chunk {
  int64_t bytes = 0;
  std::byte* buffer = nullptr;  // in the arena while resident
  bool dirty = false;           // the arena copy is newer than the tier's
  bool reading = false;         // `read` is in flight into `buffer`
  bool read_failed = false;     // `buffer` holds no valid bytes; the tier's copy does
  bool scratch = false;         // ExecutorOptions::scratch
  bool tiered = true;           // has a tier copy (not scratch, not only ever fresh)
  int64_t slot = -1;            // its NVMe slot (tiered)
  std::future<void> read;
  AlignedBuffer host;  // the host tier's copy
};

namespace {

// Waits for every future, then rethrows the first failure, so that no
// transfer is still running into or out of a buffer once this returns.
void wait_all(std::vector<std::future<void>>& futures) {
  std::exception_ptr first;
  for (auto& f : futures) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  futures.clear();
  if (first) std::rethrow_exception(first);
}

}  // namespace

ChunkExecutor::ChunkExecutor(const AccessTrace& trace, const Plan& plan,
                             const ExecutorOptions& options)
    : trace_(trace), plan_(plan), tier_(options.tier) {
  // Also catches a plan made for another trace or budget.
  replay(trace_, plan_);
  const std::size_t n = trace_.chunks.size();
  if (n == 0) throw Error("chunk executor: the trace has no chunks");
  if (!options.scratch.empty() && options.scratch.size() != n) {
    throw Error(detail::concat("chunk executor: scratch flags for ", options.scratch.size(),
                               " chunks, but the trace has ", n));
  }
  const std::size_t steps = trace_.steps.size();
  if (!options.fresh.empty() && options.fresh.size() != steps) {
    throw Error(detail::concat("chunk executor: fresh chunks for ", options.fresh.size(),
                               " steps, but the trace has ", steps));
  }
  needs_.assign(steps, std::vector<bool>(n, false));
  for (std::size_t s = 0; s < steps; ++s) {
    for (ChunkId c : trace_.steps[s]) needs_[s][c] = true;
  }
  std::vector<std::vector<bool>> fresh(steps, std::vector<bool>(n, false));
  std::vector<bool> ever_fresh(n, false);
  for (std::size_t s = 0; s < options.fresh.size(); ++s) {
    for (ChunkId c : options.fresh[s]) {
      if (c >= n || !needs_[s][c]) {
        throw Error(detail::concat("chunk executor: chunk ", c, " is fresh at step ", s,
                                   ", which does not need it"));
      }
      fresh[s][c] = true;
      ever_fresh[c] = true;
    }
  }
  // Backwards over two iterations, so that a chunk's next use may lie in
  // the next one.
  dead_.assign(steps, std::vector<bool>(n, false));
  for (ChunkId c = 0; c < n; ++c) {
    if (!ever_fresh[c]) continue;
    bool next_fresh = false;
    for (std::size_t i = 2 * steps; i-- > 0;) {
      const std::size_t s = i % steps;
      if (needs_[s][c]) next_fresh = fresh[s][c];
      dead_[s][c] = next_fresh;
    }
  }
  chunks_.resize(n);
  for (std::size_t id = 0; id < n; ++id) {
    chunks_[id].scratch = !options.scratch.empty() && options.scratch[id];
    // A chunk with a fresh use needs a tier copy only if some load of it
    // reads (a chunk without one may still never be loaded: it keeps one).
    chunks_[id].tiered = !chunks_[id].scratch && !ever_fresh[id];
  }
  const auto loaded = [&](const std::vector<ChunkId>& ids, std::size_t at) {
    for (ChunkId c : ids) {
      if (!chunks_[c].scratch && !dead_[at][c]) chunks_[c].tiered = true;
    }
  };
  loaded(plan_.initial, 0);
  for (std::size_t s = 0; s < steps; ++s) {
    loaded(plan_.steps[s].load, s);
    loaded(plan_.steps[s].prefetch, s);
  }
  int64_t largest = 0;
  int64_t slots = 0;
  for (std::size_t id = 0; id < n; ++id) {
    largest = std::max(largest, trace_.chunks[id].bytes);
    if (chunks_[id].tiered) chunks_[id].slot = slots++;
  }

  if (tier_ == LowerTier::kNvme) {
    // A trace of scratch chunks only still opens the store (one slot), so
    // that a bad nvme_dir is found on every rank alike.
    store_ = std::make_unique<NvmeStore>(options.nvme,
                                         (largest + kDefaultDirectIoAlignment - 1) /
                                             kDefaultDirectIoAlignment * kDefaultDirectIoAlignment,
                                         std::max<int64_t>(slots, 1));
    alignment_ = store_->alignment();
    lower_tier_bytes_ = slots * store_->slot_bytes();
  } else {
    alignment_ = kDefaultDirectIoAlignment;
  }
  // With every chunk a multiple of the alignment, the arena's rounded bytes
  // are exactly the plan's bytes, and the replayed plan is the arena's proof.
  for (std::size_t id = 0; id < n; ++id) {
    const int64_t bytes = trace_.chunks[id].bytes;
    if (bytes % alignment_ != 0) {
      throw Error(detail::concat(
          "chunk executor (", to_string(tier_), " tier): chunk ", id, " has ", bytes,
          " bytes, not a multiple of the direct-I/O alignment ", alignment_,
          "; chunk sizes must be multiples of it (pack() with alignment ", alignment_,
          " and a chunk size that is a multiple of it gives such chunks)"));
    }
  }
  if (store_ && store_->slot_bytes() % alignment_ != 0) {
    // Only when the store raised its alignment above 4096; the check above
    // then already refused the chunks, so this cannot be reached.
    throw Error("chunk executor: internal error: slot size not a multiple of the alignment");
  }
  arena_ = std::make_unique<ComputeArena>(plan_.budget_bytes, alignment_);

  // Initial contents go to the lower tier through one staging buffer, so
  // that the tier's copy of every chunk is valid from the start: a clean
  // chunk can then always be dropped on eviction.
  AlignedBuffer staging;
  if (store_) staging = allocate_aligned(largest, alignment_);
  for (std::size_t id = 0; id < n; ++id) {
    Chunk& c = chunks_[id];
    c.bytes = trace_.chunks[id].bytes;
    if (!c.tiered) continue;
    std::byte* dst = nullptr;
    if (store_) {
      dst = staging.get();
    } else {
      c.host = allocate_aligned(c.bytes, alignment_);
      dst = c.host.get();
      lower_tier_bytes_ += c.bytes;
    }
    if (options.init) {
      options.init(id, dst, c.bytes);
    } else {
      std::memset(dst, 0, static_cast<std::size_t>(c.bytes));
    }
    if (store_) store_->write(c.slot, dst, c.bytes).get();
  }
}

ChunkExecutor::~ChunkExecutor() {
  for (std::size_t id = 0; id < chunks_.size(); ++id) {
    Chunk& c = chunks_[id];
    if (c.reading) {
      try {
        c.read.get();
      } catch (...) {
      }
    }
  }
  // The store's threads are idle now; destroy it before unmapping buffers.
  store_.reset();
  for (Chunk& c : chunks_) {
    if (c.buffer) arena_->release(c.buffer, c.bytes);
    c.buffer = nullptr;
  }
}

std::string ChunkExecutor::where() const {
  return detail::concat("chunk executor (", to_string(tier_), " tier, plan '", plan_.policy,
                        "', budget ", plan_.budget_bytes, " bytes)");
}

void ChunkExecutor::check_usable(const char* what) const {
  if (broken_) {
    throw Error(detail::concat(where(), ": ", what,
                               " refused: an earlier transfer failed, so chunk contents and "
                               "residency are no longer known"));
  }
}

void ChunkExecutor::check_id(ChunkId id, const char* what) const {
  if (id >= chunks_.size()) {
    throw Error(detail::concat(where(), ": ", what, " of chunk ", id, ", which the trace (",
                               chunks_.size(), " chunks) does not have"));
  }
}

bool ChunkExecutor::resident(ChunkId id) const {
  check_id(id, "resident()");
  return chunks_[id].buffer != nullptr;
}

bool ChunkExecutor::has_tier_copy(ChunkId id) const {
  check_id(id, "has_tier_copy()");
  return chunks_[id].tiered;
}

void ChunkExecutor::wait_read(ChunkId id) {
  Chunk& c = chunks_[id];
  if (!c.reading) return;
  c.reading = false;
  try {
    c.read.get();
  } catch (...) {
    c.read_failed = true;
    broken_ = true;
    throw;
  }
}

// Allocates chunk `id`'s arena buffer and fills it from the lower tier. The
// NVMe read stays in flight when `wait` is false (a prefetch): wait_read()
// finishes it. The host tier copies at once (a later pinned host tier
// copies on a stream instead).
void ChunkExecutor::start_read(ChunkId id, std::size_t at, bool wait) {
  Chunk& c = chunks_[id];
  KOLOS_CHECK(c.buffer == nullptr, "internal error: chunk ", id, " loaded while resident");
  c.buffer = arena_->allocate(c.bytes);
  c.dirty = false;
  if (c.scratch) return;  // the caller fills it
  if (dead_[at][id]) {
    // Its next use overwrites it: nothing to read.
    stats_.bytes_not_read += c.bytes;
    return;
  }
  KOLOS_CHECK(c.tiered, "internal error: chunk ", id, " read before step ", at,
              " but it has no tier copy");
  stats_.bytes_read += c.bytes;
  if (!store_) {
    std::memcpy(c.buffer, c.host.get(), static_cast<std::size_t>(c.bytes));
    return;
  }
  try {
    c.read = store_->read(c.slot, c.buffer, c.bytes);
  } catch (...) {
    c.read_failed = true;
    broken_ = true;
    throw;
  }
  c.reading = true;
  if (wait) wait_read(id);
}

void ChunkExecutor::evict(const std::vector<ChunkId>& ids, std::size_t at) {
  // A prefetched chunk can be evicted before its use (deep prefetching):
  // its read must be finished before the buffer goes.
  for (ChunkId id : ids) wait_read(id);
  std::vector<ChunkId> dirty;
  for (ChunkId id : ids) {
    const Chunk& c = chunks_[id];
    KOLOS_CHECK(c.buffer != nullptr, "internal error: chunk ", id, " evicted while not resident");
    // A chunk without a tier copy is loaded only where its bytes are dead,
    // so it leaves only where they are dead too (the plan was replayed).
    KOLOS_CHECK(c.scratch || c.tiered || dead_[at][id], "internal error: chunk ", id,
                " evicted before step ", at, " with live bytes and no tier copy");
    if (c.dirty && !dead_[at][id]) {
      dirty.push_back(id);
    } else {
      if (c.dirty) stats_.bytes_not_written += c.bytes;
      ++stats_.clean_drops;
    }
  }
  // The evicted room is reused by this step's loads, so the writes finish
  // before their buffers return to the arena.
  write_back(dirty);
  for (ChunkId id : ids) {
    Chunk& c = chunks_[id];
    arena_->release(c.buffer, c.bytes);
    c.buffer = nullptr;
    c.dirty = false;
  }
}

void ChunkExecutor::load(const std::vector<ChunkId>& ids, std::size_t at) {
  // Start every read, then wait, so the drive sees them together.
  for (ChunkId id : ids) start_read(id, at, false);
  std::exception_ptr first;
  for (ChunkId id : ids) {
    try {
      wait_read(id);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void ChunkExecutor::prefetch(const std::vector<ChunkId>& ids, std::size_t at) {
  for (ChunkId id : ids) start_read(id, at, false);
}

void ChunkExecutor::begin_step(std::size_t step) {
  check_usable("begin_step");
  if (step != next_step_) {
    throw Error(detail::concat(where(), ": begin_step(", step, ") out of order; step ", next_step_,
                               " comes next (steps run in trace order, ", trace_.steps.size(),
                               " per iteration)"));
  }
  in_step_ = false;
  if (step == 0) {
    // The plan is for one iteration from its initial set: leave exactly that.
    std::vector<bool> initial(chunks_.size(), false);
    for (ChunkId id : plan_.initial) initial[id] = true;
    std::vector<ChunkId> leave, enter;
    for (ChunkId id = 0; id < chunks_.size(); ++id) {
      if (chunks_[id].buffer && !initial[id]) leave.push_back(id);
      if (!chunks_[id].buffer && initial[id]) enter.push_back(id);
    }
    evict(leave, 0);
    load(enter, 0);
  }
  const StepMoves& moves = plan_.steps[step];
  evict(moves.evict, step);
  load(moves.load, step);
  for (ChunkId id : trace_.steps[step]) wait_read(id);
  prefetch(moves.prefetch, step);
  KOLOS_CHECK(arena_->live_bytes() == moves.resident_bytes, "internal error: step ", step,
              " runs with ", arena_->live_bytes(), " arena bytes live but the plan says ",
              moves.resident_bytes);
  current_step_ = step;
  in_step_ = true;
  next_step_ = step + 1;
  if (next_step_ == trace_.steps.size()) {
    next_step_ = 0;
    ++stats_.iterations;
  }
}

std::byte* ChunkExecutor::chunk(ChunkId id) {
  check_usable("chunk()");
  check_id(id, "chunk()");
  if (!in_step_ || !needs_[current_step_][id]) {
    throw Error(detail::concat(where(), ": chunk(", id, ") outside a step that needs it",
                               in_step_ ? detail::concat(" (step ", current_step_, " does not)")
                                        : std::string(" (no step begun)")));
  }
  Chunk& c = chunks_[id];
  KOLOS_CHECK(c.buffer != nullptr && !c.reading, "internal error: chunk ", id,
              " not ready in step ", current_step_);
  return c.buffer;
}

void ChunkExecutor::mark_dirty(ChunkId id) {
  chunk(id);  // the same checks
  if (chunks_[id].scratch) {
    throw Error(detail::concat(where(), ": mark_dirty(", id,
                               ") of a scratch chunk, which has no tier copy to write"));
  }
  chunks_[id].dirty = true;
}

void ChunkExecutor::flush() {
  check_usable("flush");
  std::vector<ChunkId> dirty;
  for (ChunkId id = 0; id < chunks_.size(); ++id) {
    const Chunk& c = chunks_[id];
    if (c.buffer && c.dirty && c.tiered && !dead_[next_step_][id]) dirty.push_back(id);
  }
  write_back(dirty);
}

void ChunkExecutor::write_back(const std::vector<ChunkId>& ids) {
  std::vector<std::future<void>> writes;
  for (ChunkId id : ids) {
    Chunk& c = chunks_[id];
    stats_.bytes_written += c.bytes;
    if (store_) {
      try {
        writes.push_back(store_->write(c.slot, c.buffer, c.bytes));
      } catch (...) {
        broken_ = true;
        wait_all(writes);
        throw;
      }
    } else {
      std::memcpy(c.host.get(), c.buffer, static_cast<std::size_t>(c.bytes));
    }
  }
  try {
    wait_all(writes);
  } catch (...) {
    broken_ = true;
    throw;
  }
  for (ChunkId id : ids) chunks_[id].dirty = false;
}

void ChunkExecutor::read_chunk(ChunkId id, void* dst) {
  check_id(id, "read_chunk()");
  Chunk& c = chunks_[id];
  if (c.scratch) {
    throw Error(detail::concat(where(), ": read_chunk(", id,
                               ") of a scratch chunk, whose bytes are the caller's"));
  }
  if (!c.tiered) {
    throw Error(detail::concat(where(), ": read_chunk(", id,
                               ") of a chunk without a tier copy (its bytes live only between "
                               "a fresh use and its last use)"));
  }
  const auto bytes = static_cast<std::size_t>(c.bytes);
  if (c.buffer && !c.read_failed) {
    wait_read(id);
    std::memcpy(dst, c.buffer, bytes);
    return;
  }
  if (!store_) {
    std::memcpy(dst, c.host.get(), bytes);
    return;
  }
  // Straight into `dst` when direct I/O can use it; through a bounce buffer
  // (one chunk, kept) otherwise.
  if (reinterpret_cast<std::uintptr_t>(dst) % static_cast<std::uintptr_t>(alignment_) == 0) {
    store_->read(c.slot, dst, c.bytes).get();
    return;
  }
  if (!bounce_) bounce_ = allocate_aligned(store_->slot_bytes(), alignment_);
  store_->read(c.slot, bounce_.get(), c.bytes).get();
  std::memcpy(dst, bounce_.get(), bytes);
}

void ChunkExecutor::write_chunk(ChunkId id, const void* src) {
  check_usable("write_chunk()");
  check_id(id, "write_chunk()");
  Chunk& c = chunks_[id];
  if (c.scratch || !c.tiered) {
    throw Error(detail::concat(where(), ": write_chunk(", id, ") of a ",
                               c.scratch ? "scratch chunk" : "chunk only ever loaded fresh",
                               ", which has no tier copy"));
  }
  const auto bytes = static_cast<std::size_t>(c.bytes);
  if (c.buffer) {
    wait_read(id);
    std::memcpy(c.buffer, src, bytes);
    c.dirty = true;
    return;
  }
  if (!store_) {
    std::memcpy(c.host.get(), src, bytes);
    return;
  }
  if (!bounce_) bounce_ = allocate_aligned(store_->slot_bytes(), alignment_);
  std::memcpy(bounce_.get(), src, bytes);
  try {
    store_->write(c.slot, bounce_.get(), c.bytes).get();
  } catch (...) {
    broken_ = true;
    throw;
  }
  stats_.bytes_written += c.bytes;
}

}  // namespace kolos::memory
