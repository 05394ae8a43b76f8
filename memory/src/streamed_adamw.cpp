#include "kolos/memory/streamed_adamw.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <string>
#include <vector>

#include "kolos/core/error.h"

namespace kolos::memory {

namespace {

constexpr int kArrays = 3;  // param, exp_avg, exp_avg_sq
const char* const kArrayName[kArrays] = {"param", "exp_avg", "exp_avg_sq"};

struct BufferSet {
  AlignedBuffer array[kArrays];
  float* f(int a) const { return reinterpret_cast<float*>(array[a].get()); }
};

// One chunk whose I/O was queued: the buffer set it holds and one future per
// slot (a future stays invalid when queuing it threw).
struct InFlight {
  int64_t chunk = 0;
  BufferSet* set = nullptr;
  std::future<void> io[kArrays];
};

}  // namespace

struct StreamedAdamW::Impl {
  NvmeStore& store;
  StreamedAdamWOptions options;
  int64_t chunks = 0;
  int64_t max_sets = 0;

  std::vector<std::unique_ptr<BufferSet>> sets;  // every set allocated
  std::vector<BufferSet*> free_sets;
  int64_t in_use = 0;
  int64_t peak_in_use = 0;

  std::deque<InFlight> reads;   // queued reads, in chunk order
  std::deque<InFlight> writes;  // queued write-backs, in chunk order

  Impl(NvmeStore& s, const StreamedAdamWOptions& o) : store(s), options(o) {}

  int64_t chunk_numel(int64_t c) const {
    return std::min(options.chunk_numel, options.numel - c * options.chunk_numel);
  }
  int64_t slot(int64_t c, int a) const { return options.first_slot + kArrays * c + a; }

  std::string describe(const char* op, int64_t c) const {
    const int64_t first = c * options.chunk_numel;
    return std::string("StreamedAdamW::") + op + ": chunk " + std::to_string(c) + " of " +
           std::to_string(chunks) + " (elements " + std::to_string(first) + ".." +
           std::to_string(first + chunk_numel(c) - 1) + ", slots " + std::to_string(slot(c, 0)) +
           "-" + std::to_string(slot(c, kArrays - 1)) + ")";
  }

  [[noreturn]] void fail(const char* op, int64_t c, const std::string& what,
                         const std::exception& e) const {
    const auto* ke = dynamic_cast<const Error*>(&e);
    throw Error(describe(op, c) + ": " + what + ": " + e.what(),
                ke != nullptr ? ke->kind() : ErrorKind::kGeneric);
  }

  // A buffer set for one more chunk in flight. When all max_sets exist and
  // none is free, the oldest write-back is waited for and its set reused:
  // this is what bounds host memory.
  BufferSet* acquire(const char* op) {
    while (!writes.empty() && free_sets.empty() && sets.size() == static_cast<size_t>(max_sets)) {
      finish_oldest_write(op);
    }
    if (free_sets.empty()) {
      KOLOS_CHECK(sets.size() < static_cast<size_t>(max_sets), "StreamedAdamW: all ", max_sets,
                  " buffer sets held by reads");
      auto set = std::make_unique<BufferSet>();
      for (auto& buffer : set->array)
        buffer = allocate_aligned(store.slot_bytes(), store.alignment());
      free_sets.push_back(set.get());
      sets.push_back(std::move(set));
    }
    BufferSet* set = free_sets.back();
    free_sets.pop_back();
    peak_in_use = std::max(peak_in_use, ++in_use);
    return set;
  }
  void release(BufferSet* set) {
    free_sets.push_back(set);
    --in_use;
  }

  // Waits for every future of `x`, gives its set back (unless keep_set and
  // all succeeded: a read whose data is used next), then throws the first
  // error naming the chunk.
  void finish(InFlight& x, const char* op, const char* io, bool keep_set = false) {
    std::exception_ptr error;
    int failed = 0;
    for (int a = 0; a < kArrays; ++a) {
      if (!x.io[a].valid()) continue;
      try {
        x.io[a].get();
      } catch (...) {
        if (!error) {
          error = std::current_exception();
          failed = a;
        }
      }
    }
    if (!error && keep_set) return;
    release(x.set);
    x.set = nullptr;
    if (!error) return;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      fail(op, x.chunk,
           std::string(io) + " of " + kArrayName[failed] + " (slot " +
               std::to_string(slot(x.chunk, failed)) + ")",
           e);
    }
  }
  void finish_oldest_write(const char* op) {
    InFlight w = std::move(writes.front());
    writes.pop_front();
    finish(w, op, "write");
  }

  // Queues the reads (or writes) of chunk c's three slots. The entry is in
  // its queue before the first request, so a request that throws at once
  // leaves the earlier ones where drain() waits for them.
  void queue_read(const char* op, int64_t c) {
    BufferSet* set = acquire(op);
    reads.push_back(InFlight{c, set, {}});
    InFlight& r = reads.back();
    for (int a = 0; a < kArrays; ++a) {
      try {
        r.io[a] = store.read(slot(c, a), set->array[a].get());
      } catch (const std::exception& e) {
        fail(op, c,
             std::string("read of ") + kArrayName[a] + " (slot " + std::to_string(slot(c, a)) + ")",
             e);
      }
    }
  }
  void queue_write(const char* op, int64_t c, BufferSet* set) {
    writes.push_back(InFlight{c, set, {}});
    InFlight& w = writes.back();
    for (int a = 0; a < kArrays; ++a) {
      try {
        w.io[a] = store.write(slot(c, a), set->array[a].get());
      } catch (const std::exception& e) {
        fail(
            op, c,
            std::string("write of ") + kArrayName[a] + " (slot " + std::to_string(slot(c, a)) + ")",
            e);
      }
    }
  }

  // After a failure: waits for all I/O still in flight (its buffers must
  // stay alive until then) and drops its errors; the first one is thrown.
  void drain() noexcept {
    for (auto* queue : {&reads, &writes}) {
      for (InFlight& x : *queue) {
        for (auto& f : x.io) {
          if (f.valid()) f.wait();
        }
        if (x.set != nullptr) release(x.set);
      }
      queue->clear();
    }
  }
  void finish_all_writes(const char* op) {
    while (!writes.empty()) finish_oldest_write(op);
  }

  // Runs `body`; on any exception waits for the I/O in flight first.
  template <typename Body>
  void guarded(Body&& body) {
    try {
      body();
    } catch (...) {
      drain();
      throw;
    }
  }

  // Reads chunk c (queued `prefetch` chunks ahead) and returns its entry.
  InFlight next_read(const char* op, int64_t c, int64_t& queued) {
    while (queued < chunks && queued <= c + options.prefetch) queue_read(op, queued++);
    InFlight r = std::move(reads.front());
    reads.pop_front();
    finish(r, op, "read", /*keep_set=*/true);
    return r;
  }
};

StreamedAdamW::StreamedAdamW(NvmeStore& store, const StreamedAdamWOptions& options)
    : impl_(std::make_unique<Impl>(store, options)) {
  KOLOS_CHECK(options.numel > 0, "StreamedAdamW: numel must be > 0, got ", options.numel);
  KOLOS_CHECK(options.chunk_numel > 0, "StreamedAdamW: chunk_numel must be > 0, got ",
              options.chunk_numel);
  KOLOS_CHECK(options.chunk_numel <= store.slot_bytes() / static_cast<int64_t>(sizeof(float)),
              "StreamedAdamW: a chunk of ", options.chunk_numel, " fp32 elements (",
              options.chunk_numel * 4, " bytes) does not fit a slot of ", store.slot_bytes(),
              " bytes; use chunk_numel <= ", store.slot_bytes() / 4);
  KOLOS_CHECK(options.first_slot >= 0, "StreamedAdamW: first_slot must be >= 0, got ",
              options.first_slot);
  KOLOS_CHECK(options.prefetch >= 0, "StreamedAdamW: prefetch must be >= 0, got ",
              options.prefetch);
  impl_->chunks = (options.numel + options.chunk_numel - 1) / options.chunk_numel;
  const int64_t needed = slots_needed(options.numel, options.chunk_numel);
  KOLOS_CHECK(options.first_slot + needed <= store.slots(), "StreamedAdamW: ", impl_->chunks,
              " chunks need slots ", options.first_slot, "..", options.first_slot + needed - 1,
              " but the store has ", store.slots(), " slots; make it with at least ",
              options.first_slot + needed);
  impl_->max_sets = options.prefetch + 2;
}

StreamedAdamW::~StreamedAdamW() { impl_->drain(); }

int64_t StreamedAdamW::slots_needed(int64_t numel, int64_t chunk_numel) {
  KOLOS_CHECK(numel > 0 && chunk_numel > 0, "StreamedAdamW::slots_needed: numel (", numel,
              ") and chunk_numel (", chunk_numel, ") must be > 0");
  return kArrays * ((numel + chunk_numel - 1) / chunk_numel);
}

void StreamedAdamW::upload(const float* param, const float* exp_avg, const float* exp_avg_sq) {
  Impl& m = *impl_;
  const float* src[kArrays] = {param, exp_avg, exp_avg_sq};
  for (int a = 0; a < kArrays; ++a) {
    KOLOS_CHECK(src[a] != nullptr, "StreamedAdamW::upload: ", kArrayName[a], " is null");
  }
  m.guarded([&] {
    for (int64_t c = 0; c < m.chunks; ++c) {
      BufferSet* set = m.acquire("upload");
      const int64_t n = m.chunk_numel(c);
      const size_t bytes = static_cast<size_t>(n) * sizeof(float);
      for (int a = 0; a < kArrays; ++a) {
        std::memcpy(set->array[a].get(), src[a] + c * m.options.chunk_numel, bytes);
        // The tail of a partial chunk's slot: zeros, not uninitialised memory.
        std::memset(set->array[a].get() + bytes, 0,
                    static_cast<size_t>(m.store.slot_bytes()) - bytes);
      }
      m.queue_write("upload", c, set);
    }
    m.finish_all_writes("upload");
  });
}

void StreamedAdamW::download(float* param, float* exp_avg, float* exp_avg_sq) {
  Impl& m = *impl_;
  float* dst[kArrays] = {param, exp_avg, exp_avg_sq};
  for (int a = 0; a < kArrays; ++a) {
    KOLOS_CHECK(dst[a] != nullptr, "StreamedAdamW::download: ", kArrayName[a], " is null");
  }
  m.guarded([&] {
    int64_t queued = 0;
    for (int64_t c = 0; c < m.chunks; ++c) {
      InFlight r = m.next_read("download", c, queued);
      const size_t bytes = static_cast<size_t>(m.chunk_numel(c)) * sizeof(float);
      for (int a = 0; a < kArrays; ++a) {
        std::memcpy(dst[a] + c * m.options.chunk_numel, r.set->array[a].get(), bytes);
      }
      m.release(r.set);
    }
  });
}

void StreamedAdamW::step(const float* grad, const kernels::AdamWConfig& config) {
  KOLOS_CHECK(grad != nullptr, "StreamedAdamW::step: grad is null");
  std::vector<const float*> per_chunk(static_cast<size_t>(impl_->chunks));
  for (int64_t c = 0; c < impl_->chunks; ++c) per_chunk[c] = grad + c * impl_->options.chunk_numel;
  step(per_chunk.data(), config);
}

void StreamedAdamW::step(const float* const* chunk_grads, const kernels::AdamWConfig& config) {
  Impl& m = *impl_;
  KOLOS_CHECK(chunk_grads != nullptr, "StreamedAdamW::step: chunk_grads is null");
  for (int64_t c = 0; c < m.chunks; ++c) {
    KOLOS_CHECK(chunk_grads[c] != nullptr, "StreamedAdamW::step: the gradient of chunk ", c,
                " is null");
  }
  m.guarded([&] {
    int64_t queued = 0;
    for (int64_t c = 0; c < m.chunks; ++c) {
      // Reads of c+1 .. c+prefetch are queued before c is waited for, and
      // the write of c-1 is still running: the update below overlaps both.
      InFlight r = m.next_read("step", c, queued);
      BufferSet* set = r.set;
      try {
        kernels::adamw_step_fp32(set->f(0), chunk_grads[c], set->f(1), set->f(2), m.chunk_numel(c),
                                 config, m.options.kernel_threads);
      } catch (const std::exception& e) {
        m.release(set);
        m.fail("step", c, "AdamW kernel", e);
      }
      m.queue_write("step", c, set);
    }
    // The slots must not be read (next step, download) while written.
    m.finish_all_writes("step");
  });
}

int64_t StreamedAdamW::chunks() const noexcept { return impl_->chunks; }
int64_t StreamedAdamW::chunk_numel(int64_t chunk) const {
  KOLOS_CHECK(chunk >= 0 && chunk < impl_->chunks, "StreamedAdamW::chunk_numel: chunk ", chunk,
              " out of range [0, ", impl_->chunks, ")");
  return impl_->chunk_numel(chunk);
}
int64_t StreamedAdamW::max_buffer_sets() const noexcept { return impl_->max_sets; }
int64_t StreamedAdamW::max_host_bytes() const noexcept {
  return impl_->max_sets * kArrays * impl_->store.slot_bytes();
}
int64_t StreamedAdamW::buffer_sets_allocated() const noexcept {
  return static_cast<int64_t>(impl_->sets.size());
}
int64_t StreamedAdamW::peak_buffer_sets_in_use() const noexcept { return impl_->peak_in_use; }

}  // namespace kolos::memory
