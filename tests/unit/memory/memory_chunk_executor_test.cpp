// ChunkExecutor: plans run with real bytes over the NVMe and host tiers give
// bit-equal results to the same updates applied with no tiers at all, the
// arena never holds more than the budget, clean chunks are never written,
// each misuse is refused, and (in a forked child) the process's peak
// resident memory grows by no more than the budget plus a fixed overhead
// while chunks of four times the budget stream through it.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kolos/core/error.h"
#include "kolos/memory/chunk_executor.h"
#include "kolos/memory/placement.h"
#include "memory_test_support.h"

#if defined(__SANITIZE_ADDRESS__)
#define KOLOS_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KOLOS_TEST_ASAN 1
#endif
#endif
#ifndef KOLOS_TEST_ASAN
#define KOLOS_TEST_ASAN 0
#endif

namespace fs = std::filesystem;
using namespace kolos::memory;

namespace {

using kolos::memory::testing::error_of;
using kolos::memory::testing::TempDir;

constexpr int64_t kPage = 4096;

// `chunks` chunks of 1 to `max_pages` pages of random kinds; `steps` steps
// of 1 to 3 distinct random chunks.
AccessTrace random_trace(uint64_t seed, std::size_t chunks, std::size_t steps, int max_pages,
                         int64_t page = kPage) {
  std::mt19937_64 rng(seed);
  AccessTrace trace;
  for (std::size_t c = 0; c < chunks; ++c) {
    ChunkInfo info;
    info.bytes = page * static_cast<int64_t>(1 + rng() % static_cast<uint64_t>(max_pages));
    info.kind = static_cast<StateKind>(rng() % 3);
    trace.chunks.push_back(info);
  }
  for (std::size_t s = 0; s < steps; ++s) {
    std::set<ChunkId> step;
    const std::size_t n = 1 + rng() % 3;
    while (step.size() < n) step.insert(rng() % chunks);
    trace.steps.emplace_back(step.begin(), step.end());
  }
  return trace;
}

int64_t total_bytes(const AccessTrace& trace) {
  int64_t total = 0;
  for (const ChunkInfo& c : trace.chunks) total += c.bytes;
  return total;
}

// About a quarter of all chunk bytes, at least the largest step.
int64_t quarter_budget(const AccessTrace& trace) {
  int64_t budget = total_bytes(trace) / 4 / kPage * kPage;
  for (std::size_t s = 0; s < trace.steps.size(); ++s) {
    budget = std::max(budget, working_set_bytes(trace, s));
  }
  return budget;
}

// Initial contents: a function of the chunk and the word.
void init_chunk(ChunkId id, std::byte* dst, int64_t bytes) {
  for (int64_t w = 0; w < bytes / 8; ++w) {
    const uint64_t v = (id + 1) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(w) * 0x2545F491ull;
    std::memcpy(dst + w * 8, &v, 8);
  }
}

// What a step does to a chunk it needs: w = 3w + f(iteration, step, chunk,
// word). Not commutative, so an update applied to a stale copy, lost, or
// applied out of order changes the result.
void update_chunk(int iteration, std::size_t step, ChunkId id, std::byte* p, int64_t bytes) {
  const uint64_t base =
      static_cast<uint64_t>(iteration) * 1000003ull + step * 7919ull + id * 131ull;
  for (int64_t w = 0; w < bytes / 8; ++w) {
    uint64_t v;
    std::memcpy(&v, p + w * 8, 8);
    v = v * 3 + base + static_cast<uint64_t>(w);
    std::memcpy(p + w * 8, &v, 8);
  }
}

// The same iterations with every chunk in plain memory.
std::vector<std::vector<std::byte>> reference(const AccessTrace& trace, int iterations) {
  std::vector<std::vector<std::byte>> chunks(trace.chunks.size());
  for (ChunkId id = 0; id < chunks.size(); ++id) {
    chunks[id].resize(static_cast<std::size_t>(trace.chunks[id].bytes));
    init_chunk(id, chunks[id].data(), trace.chunks[id].bytes);
  }
  for (int it = 0; it < iterations; ++it) {
    for (std::size_t s = 0; s < trace.steps.size(); ++s) {
      for (ChunkId id : std::set<ChunkId>(trace.steps[s].begin(), trace.steps[s].end())) {
        update_chunk(it, s, id, chunks[id].data(), trace.chunks[id].bytes);
      }
    }
  }
  return chunks;
}

void run_iterations(ChunkExecutor& exec, const AccessTrace& trace, int iterations,
                    bool write = true) {
  for (int it = 0; it < iterations; ++it) {
    for (std::size_t s = 0; s < trace.steps.size(); ++s) {
      exec.begin_step(s);
      for (ChunkId id : std::set<ChunkId>(trace.steps[s].begin(), trace.steps[s].end())) {
        if (!write) continue;
        update_chunk(it, s, id, exec.chunk(id), trace.chunks[id].bytes);
        exec.mark_dirty(id);
      }
    }
  }
}

ExecutorOptions options_for(LowerTier tier, const std::string& dir) {
  ExecutorOptions options;
  options.tier = tier;
  options.nvme.dir = dir;
  options.nvme.threads = 4;
  options.init = init_chunk;
  return options;
}

struct Case {
  const char* policy;
  LowerTier tier;
};

class ExecutorEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(ExecutorEquivalence, ThreeIterationsBitEqualToNoTiers) {
  const Case param = GetParam();
  const AccessTrace trace = random_trace(20261202, 40, 60, 4);
  const int64_t budget = quarter_budget(trace);
  ASSERT_LE(budget * 7, total_bytes(trace) * 2) << "budget is not about a quarter";
  const Plan plan = std::string(param.policy) == "auto"
                        ? plan_auto(trace, budget)
                        : plan_static(trace, budget, StaticFractions{0.2, 0.0, 0.1});
  if (std::string(param.policy) == "static") ASSERT_FALSE(plan.initial.empty());

  TempDir dir;
  const int kIterations = 3;
  ChunkExecutor exec(trace, plan, options_for(param.tier, dir.path()));
  run_iterations(exec, trace, kIterations);

  const auto expected = reference(trace, kIterations);
  // Before and after a flush: read_chunk gives the current bytes wherever
  // they are; into an unaligned buffer too.
  for (int pass = 0; pass < 2; ++pass) {
    std::size_t resident = 0;
    for (ChunkId id = 0; id < expected.size(); ++id) {
      std::vector<std::byte> got(expected[id].size() + 1);
      std::byte* dst = got.data() + (id % 2);  // odd ids unaligned
      exec.read_chunk(id, dst);
      resident += exec.resident(id) ? 1 : 0;
      EXPECT_EQ(std::memcmp(dst, expected[id].data(), expected[id].size()), 0)
          << "chunk " << id << " pass " << pass;
    }
    EXPECT_GT(resident, 0u);
    EXPECT_LT(resident, expected.size());
    exec.flush();
  }

  EXPECT_LE(exec.arena().peak_bytes(), budget);
  EXPECT_EQ(exec.arena().peak_bytes(), plan.peak_resident_bytes);
  EXPECT_EQ(exec.stats().iterations, kIterations);
  // The lower tier was really used, both ways.
  EXPECT_GT(exec.stats().bytes_read, total_bytes(trace));
  EXPECT_GT(exec.stats().bytes_written, total_bytes(trace) / 2);
  EXPECT_EQ(exec.nvme_store() != nullptr, param.tier == LowerTier::kNvme);
}

INSTANTIATE_TEST_SUITE_P(PoliciesAndTiers, ExecutorEquivalence,
                         ::testing::Values(Case{"auto", LowerTier::kNvme},
                                           Case{"static", LowerTier::kNvme},
                                           Case{"auto", LowerTier::kHost},
                                           Case{"static", LowerTier::kHost}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.policy) + "_" + to_string(info.param.tier);
                         });

TEST(ChunkExecutor, DeepPrefetchEvictedBeforeUseStaysEqual) {
  // Prefetch depth 3 may fetch a chunk that is evicted before its use; its
  // read must finish before the buffer goes, and it must not be written.
  const AccessTrace trace = random_trace(7, 30, 80, 3);
  const int64_t budget = quarter_budget(trace);
  const Plan plan = plan_auto(trace, budget, 3);
  TempDir dir;
  ChunkExecutor exec(trace, plan, options_for(LowerTier::kNvme, dir.path()));
  run_iterations(exec, trace, 2);
  const auto expected = reference(trace, 2);
  for (ChunkId id = 0; id < expected.size(); ++id) {
    std::vector<std::byte> got(expected[id].size());
    exec.read_chunk(id, got.data());
    EXPECT_EQ(got, expected[id]) << "chunk " << id;
  }
  EXPECT_LE(exec.arena().peak_bytes(), budget);
}

TEST(ChunkExecutor, CleanChunksAreDroppedNotWritten) {
  const AccessTrace trace = random_trace(11, 24, 40, 2);
  const Plan plan = plan_auto(trace, quarter_budget(trace));
  ASSERT_GT(plan.bytes_evicted, 0);
  for (LowerTier tier : {LowerTier::kNvme, LowerTier::kHost}) {
    TempDir dir;
    ChunkExecutor exec(trace, plan, options_for(tier, dir.path()));
    run_iterations(exec, trace, 2, /*write=*/false);
    exec.flush();
    EXPECT_EQ(exec.stats().bytes_written, 0) << to_string(tier);
    EXPECT_GT(exec.stats().clean_drops, 0) << to_string(tier);
    const auto expected = reference(trace, 0);
    for (ChunkId id = 0; id < expected.size(); ++id) {
      std::vector<std::byte> got(expected[id].size());
      exec.read_chunk(id, got.data());
      EXPECT_EQ(got, expected[id]) << to_string(tier) << " chunk " << id;
    }
  }
}

// Scratch chunks (ZeRO-3's parameter chunks another rank owns): no tier
// copy, no reads or writes of them; the caller's bytes stay while the chunk
// stays resident from one step to the next; the other chunks end as in
// plain memory.
TEST(ChunkExecutor, ScratchChunksHaveNoTierCopy) {
  const AccessTrace trace = random_trace(17, 30, 50, 3);
  const Plan plan = plan_auto(trace, quarter_budget(trace));
  std::vector<bool> scratch(trace.chunks.size(), false);
  int64_t kept = 0;
  for (ChunkId id = 0; id < trace.chunks.size(); ++id) {
    scratch[id] = id % 3 == 1;
    if (!scratch[id]) kept += trace.chunks[id].bytes;
  }
  const auto expected = reference(trace, 2);
  for (LowerTier tier : {LowerTier::kNvme, LowerTier::kHost}) {
    TempDir dir;
    ExecutorOptions options = options_for(tier, dir.path());
    options.scratch = scratch;
    ChunkExecutor exec(trace, plan, options);
    if (tier == LowerTier::kHost) {
      EXPECT_EQ(exec.lower_tier_bytes(), kept);
    } else {
      const int64_t slots = exec.nvme_store()->slots();
      EXPECT_EQ(slots, static_cast<int64_t>(std::count(scratch.begin(), scratch.end(), false)));
      EXPECT_EQ(exec.lower_tier_bytes(), slots * exec.nvme_store()->slot_bytes());
    }
    int64_t refilled = 0;
    for (int it = 0; it < 2; ++it) {
      for (std::size_t s = 0; s < trace.steps.size(); ++s) {
        exec.begin_step(s);
        for (ChunkId id : std::set<ChunkId>(trace.steps[s].begin(), trace.steps[s].end())) {
          std::byte* p = exec.chunk(id);
          const auto bytes = static_cast<std::size_t>(trace.chunks[id].bytes);
          if (!scratch[id]) {
            update_chunk(it, s, id, p, trace.chunks[id].bytes);
            exec.mark_dirty(id);
            continue;
          }
          const auto& previous = trace.steps[s == 0 ? trace.steps.size() - 1 : s - 1];
          const bool kept_resident =
              s > 0 && std::find(previous.begin(), previous.end(), id) != previous.end();
          if (kept_resident) {
            // Still the bytes the caller put there when it entered.
            EXPECT_EQ(std::to_integer<int>(p[0]), static_cast<int>(id % 251)) << "chunk " << id;
          } else {
            std::memset(p, static_cast<int>(id % 251), bytes);
            ++refilled;
          }
          EXPECT_THROW(exec.mark_dirty(id), kolos::Error);
        }
      }
    }
    EXPECT_GT(refilled, 0);
    exec.flush();
    for (ChunkId id = 0; id < expected.size(); ++id) {
      std::vector<std::byte> got(expected[id].size());
      if (scratch[id]) {
        EXPECT_THROW(exec.read_chunk(id, got.data()), kolos::Error);
        EXPECT_THROW(exec.write_chunk(id, got.data()), kolos::Error);
        continue;
      }
      exec.read_chunk(id, got.data());
      EXPECT_EQ(got, expected[id]) << to_string(tier) << " chunk " << id;
    }
  }
}

// Fresh uses (a step that overwrites a chunk before reading it, as a
// gradient chunk is zeroed where an iteration first uses it): chunks with
// a fresh first use and chunks whose every use is fresh. Those loads read
// nothing, dirty evictions before a fresh use write nothing, chunks the
// plan only ever loads fresh take no tier copy; every use that reads a
// chunk finds the bytes it has in plain memory, and chunks never fresh end
// as there. Against the same plan without fresh uses, fewer bytes are read
// and written.
TEST(ChunkExecutor, FreshUsesReadNothingAndDeadBytesAreNotWritten) {
  const AccessTrace trace = random_trace(23, 30, 60, 3);
  const std::size_t steps = trace.steps.size();
  const Plan plan = plan_auto(trace, quarter_budget(trace));
  ASSERT_GT(plan.bytes_evicted, 0);
  const auto first_fresh = [](ChunkId id) { return id % 3 == 0; };
  const auto always_fresh = [](ChunkId id) { return id % 3 != 0 && id % 5 == 0; };
  std::vector<std::vector<ChunkId>> fresh(steps);
  std::vector<bool> seen(trace.chunks.size(), false);
  for (std::size_t s = 0; s < steps; ++s) {
    for (ChunkId id : std::set<ChunkId>(trace.steps[s].begin(), trace.steps[s].end())) {
      if (always_fresh(id) || (first_fresh(id) && !seen[id])) fresh[s].push_back(id);
      seen[id] = true;
    }
  }
  const auto is_fresh = [&](std::size_t s, ChunkId id) {
    return std::count(fresh[s].begin(), fresh[s].end(), id) > 0;
  };
  // What a fresh use writes: a function of the iteration, step and chunk only.
  const auto overwrite = [](int it, std::size_t s, ChunkId id, std::byte* p, int64_t bytes) {
    std::memset(p, static_cast<int>((it * 31 + s * 7 + id) % 251), static_cast<std::size_t>(bytes));
  };
  const int kIterations = 3;
  for (LowerTier tier : {LowerTier::kNvme, LowerTier::kHost}) {
    TempDir plain_dir;
    ChunkExecutor plain(trace, plan, options_for(tier, plain_dir.path()));
    run_iterations(plain, trace, kIterations);

    TempDir dir;
    ExecutorOptions options = options_for(tier, dir.path());
    options.fresh = fresh;
    ChunkExecutor exec(trace, plan, options);
    // The same updates in plain memory, in lockstep.
    std::vector<std::vector<std::byte>> expected = reference(trace, 0);
    int reads = 0;
    int mismatches = 0;
    for (int it = 0; it < kIterations && mismatches <= 5; ++it) {
      for (std::size_t s = 0; s < steps; ++s) {
        exec.begin_step(s);
        for (ChunkId id : std::set<ChunkId>(trace.steps[s].begin(), trace.steps[s].end())) {
          std::byte* p = exec.chunk(id);
          const int64_t bytes = trace.chunks[id].bytes;
          if (is_fresh(s, id)) {
            overwrite(it, s, id, p, bytes);
            overwrite(it, s, id, expected[id].data(), bytes);
          } else {
            ++reads;
            if (std::memcmp(p, expected[id].data(), expected[id].size()) != 0) {
              if (++mismatches <= 5) {
                ADD_FAILURE() << to_string(tier) << ": chunk " << id << " at iteration " << it
                              << " step " << s << " lost its bytes";
              }
            }
          }
          update_chunk(it, s, id, p, bytes);
          update_chunk(it, s, id, expected[id].data(), bytes);
          exec.mark_dirty(id);
        }
      }
    }
    EXPECT_GT(reads, 0);
    int64_t without_copy = 0;
    for (ChunkId id = 0; id < expected.size(); ++id) {
      std::vector<std::byte> got(expected[id].size());
      if (always_fresh(id)) {
        // Every load of it is for a fresh use.
        EXPECT_FALSE(exec.has_tier_copy(id)) << to_string(tier) << " chunk " << id;
      }
      if (!exec.has_tier_copy(id)) {
        without_copy += trace.chunks[id].bytes;
        EXPECT_THROW(exec.read_chunk(id, got.data()), kolos::Error);
        EXPECT_THROW(exec.write_chunk(id, got.data()), kolos::Error);
        continue;
      }
      if (first_fresh(id)) continue;  // dead since its last use
      exec.read_chunk(id, got.data());
      EXPECT_EQ(got, expected[id]) << to_string(tier) << " chunk " << id;
    }
    EXPECT_GT(without_copy, 0) << to_string(tier);
    if (tier == LowerTier::kHost) {
      EXPECT_EQ(exec.lower_tier_bytes(), total_bytes(trace) - without_copy);
    } else {
      EXPECT_LT(exec.nvme_store()->slots(), static_cast<int64_t>(trace.chunks.size()));
    }
    EXPECT_GT(exec.stats().bytes_not_read, 0) << to_string(tier);
    EXPECT_GT(exec.stats().bytes_not_written, 0) << to_string(tier);
    EXPECT_EQ(exec.stats().bytes_read + exec.stats().bytes_not_read, plain.stats().bytes_read)
        << to_string(tier);
    EXPECT_LT(exec.stats().bytes_written, plain.stats().bytes_written) << to_string(tier);
    EXPECT_EQ(exec.arena().peak_bytes(), plain.arena().peak_bytes()) << to_string(tier);
  }
}

// A chunk that is fresh where an iteration first uses it and stays
// resident to its last use (the budget holds it) has no tier copy; the
// same chunk evicted between two uses has one.
TEST(ChunkExecutor, FreshChunkEvictedBetweenUsesKeepsATierCopy) {
  AccessTrace trace;
  for (int c = 0; c < 4; ++c) trace.chunks.push_back({kPage, StateKind::kGrad});
  // Chunk 0 is used at steps 0 and 1; chunk 3 at steps 0 and 3, with steps
  // 1 and 2 filling the budget of 3 pages in between.
  trace.steps = {{0, 3}, {0, 1, 2}, {1, 2}, {3}};
  const std::vector<std::vector<ChunkId>> fresh = {{0, 3}, {1, 2}, {}, {}};
  const Plan plan = plan_auto(trace, 3 * kPage);
  for (LowerTier tier : {LowerTier::kNvme, LowerTier::kHost}) {
    TempDir dir;
    ExecutorOptions options = options_for(tier, dir.path());
    options.fresh = fresh;
    ChunkExecutor exec(trace, plan, options);
    EXPECT_FALSE(exec.has_tier_copy(0)) << to_string(tier);
    EXPECT_TRUE(exec.has_tier_copy(3)) << to_string(tier);
    for (std::size_t i = 0; i < 2 * trace.steps.size(); ++i) {
      const std::size_t s = i % trace.steps.size();
      exec.begin_step(s);
      for (ChunkId id : trace.steps[s]) {
        std::byte* p = exec.chunk(id);
        const bool first = std::count(fresh[s].begin(), fresh[s].end(), id) > 0;
        if (first) std::memset(p, static_cast<int>(id + 1), static_cast<std::size_t>(kPage));
        EXPECT_EQ(std::to_integer<int>(p[kPage - 1]), static_cast<int>(id + 1))
            << to_string(tier) << " chunk " << id << " at step " << s;
        exec.mark_dirty(id);
      }
    }
    // Chunk 3 went to the tier between its uses and came back.
    EXPECT_GT(exec.stats().bytes_read, 0) << to_string(tier);
  }
}

TEST(ChunkExecutor, WriteChunkReplacesBytesInEitherPlace) {
  // Mid-iteration, some chunks resident and some not: write_chunk (from an
  // unaligned buffer) replaces each chunk's bytes wherever it is; the next
  // iteration's updates then apply to the written bytes.
  const AccessTrace trace = random_trace(5, 16, 24, 2);
  const Plan plan = plan_auto(trace, quarter_budget(trace));
  for (LowerTier tier : {LowerTier::kNvme, LowerTier::kHost}) {
    TempDir dir;
    ChunkExecutor exec(trace, plan, options_for(tier, dir.path()));
    run_iterations(exec, trace, 1);
    std::vector<std::vector<std::byte>> written(trace.chunks.size());
    std::size_t resident = 0;
    for (ChunkId id = 0; id < trace.chunks.size(); ++id) {
      const auto bytes = static_cast<std::size_t>(trace.chunks[id].bytes);
      std::vector<std::byte> src(bytes + 1);
      for (std::size_t i = 0; i < bytes; ++i) src[i + 1] = static_cast<std::byte>(i * 7 + id);
      written[id].assign(src.begin() + 1, src.end());
      resident += exec.resident(id) ? 1 : 0;
      exec.write_chunk(id, src.data() + 1);
    }
    EXPECT_GT(resident, 0u) << to_string(tier);
    EXPECT_LT(resident, trace.chunks.size()) << to_string(tier);
    for (ChunkId id = 0; id < trace.chunks.size(); ++id) {
      std::vector<std::byte> got(written[id].size());
      exec.read_chunk(id, got.data());
      EXPECT_EQ(got, written[id]) << to_string(tier) << " chunk " << id;
    }
    // One more iteration from the written bytes, against the same updates
    // in plain memory.
    run_iterations(exec, trace, 1);
    for (ChunkId id = 0; id < trace.chunks.size(); ++id) {
      std::vector<std::byte> expected = written[id];
      for (std::size_t s = 0; s < trace.steps.size(); ++s) {
        const std::set<ChunkId> ids(trace.steps[s].begin(), trace.steps[s].end());
        if (ids.count(id)) update_chunk(0, s, id, expected.data(), trace.chunks[id].bytes);
      }
      std::vector<std::byte> got(expected.size());
      exec.read_chunk(id, got.data());
      EXPECT_EQ(got, expected) << to_string(tier) << " chunk " << id << " after an iteration";
    }
  }
}

TEST(ChunkExecutor, ZeroInitialContentsWithoutInitializer) {
  const AccessTrace trace = random_trace(3, 8, 10, 2);
  const Plan plan = plan_auto(trace, quarter_budget(trace));
  TempDir dir;
  ExecutorOptions options = options_for(LowerTier::kNvme, dir.path());
  options.init = nullptr;
  ChunkExecutor exec(trace, plan, options);
  for (ChunkId id = 0; id < trace.chunks.size(); ++id) {
    std::vector<std::byte> got(static_cast<std::size_t>(trace.chunks[id].bytes), std::byte{1});
    exec.read_chunk(id, got.data());
    EXPECT_EQ(got, std::vector<std::byte>(got.size(), std::byte{0})) << "chunk " << id;
  }
}

TEST(ChunkExecutor, RefusesMisuse) {
  const AccessTrace trace = random_trace(5, 10, 12, 2);
  const int64_t budget = quarter_budget(trace);
  const Plan plan = plan_auto(trace, budget);
  ChunkExecutor exec(trace, plan, options_for(LowerTier::kHost, ""));

  std::string message = error_of([&] { exec.begin_step(1); });
  EXPECT_NE(message.find("begin_step(1) out of order; step 0 comes next"), std::string::npos)
      << message;
  message = error_of([&] { exec.chunk(trace.steps[0][0]); });
  EXPECT_NE(message.find("no step begun"), std::string::npos) << message;
  exec.begin_step(0);
  ChunkId unused = 0;
  while (std::count(trace.steps[0].begin(), trace.steps[0].end(), unused) > 0) ++unused;
  message = error_of([&] { exec.mark_dirty(unused); });
  EXPECT_NE(message.find("step 0 does not"), std::string::npos) << message;
  message = error_of([&] { exec.chunk(trace.chunks.size()); });
  EXPECT_NE(message.find("which the trace (10 chunks) does not have"), std::string::npos)
      << message;

  // A chunk not a multiple of the direct-I/O alignment.
  AccessTrace odd = trace;
  odd.chunks[3].bytes += 64;
  message = error_of([&] {
    ChunkExecutor(odd, plan_auto(odd, budget + 64), ExecutorOptions{LowerTier::kHost, {}, nullptr});
  });
  EXPECT_NE(message.find("chunk 3 has"), std::string::npos) << message;
  EXPECT_NE(message.find("not a multiple of the direct-I/O alignment 4096"), std::string::npos)
      << message;

  // A plan made for another trace is refused by its replay.
  AccessTrace other = random_trace(6, 10, 12, 2);
  message = error_of([&] {
    ChunkExecutor(other, plan, ExecutorOptions{LowerTier::kHost, {}, nullptr});
  });
  EXPECT_NE(message.find("replay:"), std::string::npos) << message;
}

// A failed read (the store's file cut short behind its back) reaches the
// caller from begin_step; the executor then refuses to go on rather than
// run a step on bytes it could not load, and still shuts down cleanly.
TEST(ChunkExecutor, FailedTransferStopsTheExecutor) {
  const AccessTrace trace = random_trace(13, 12, 20, 2);
  const Plan plan = plan_auto(trace, quarter_budget(trace));
  TempDir dir;
  ChunkExecutor exec(trace, plan, options_for(LowerTier::kNvme, dir.path()));
  ASSERT_EQ(::truncate(exec.nvme_store()->file().c_str(), 0), 0);
  std::string message = error_of([&] { exec.begin_step(0); });
  EXPECT_NE(message.find("unexpected end of file"), std::string::npos) << message;
  message = error_of([&] { exec.begin_step(1); });
  EXPECT_NE(message.find("begin_step refused: an earlier transfer failed"), std::string::npos)
      << message;
  message = error_of([&] { exec.flush(); });
  EXPECT_NE(message.find("flush refused"), std::string::npos) << message;
}

TEST(ComputeArena, NeverExceedsItsBudget) {
  ComputeArena arena(4 * kPage, kPage);
  std::byte* a = arena.allocate(2 * kPage);
  std::byte* b = arena.allocate(kPage + 1);  // rounded to two pages
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % kPage, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % kPage, 0u);
  EXPECT_EQ(a[0], std::byte{0});
  EXPECT_EQ(arena.live_bytes(), 4 * kPage);
  const std::string message = error_of([&] { arena.allocate(1); });
  EXPECT_NE(message.find("internal error: compute arena asked for 4096 bytes with 16384 of its "
                         "16384 bytes live"),
            std::string::npos)
      << message;
  arena.release(a, 2 * kPage);
  EXPECT_EQ(arena.live_bytes(), 2 * kPage);
  std::byte* c = arena.allocate(2 * kPage);
  arena.release(b, kPage + 1);
  arena.release(c, 2 * kPage);
  EXPECT_EQ(arena.live_bytes(), 0);
  EXPECT_EQ(arena.peak_bytes(), 4 * kPage);

  ComputeArena wide(64 * kPage, 8 * kPage);  // alignment above the page size
  std::byte* d = wide.allocate(3 * kPage);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(d) % (8 * kPage), 0u);
  d[8 * kPage - 1] = std::byte{1};  // rounded up to the alignment: writable
  wide.release(d, 3 * kPage);
}

// Released buffers are kept mapped for the next allocation of their size;
// a size with no kept buffer maps new pages, first sending back the oldest
// kept buffers its room needs; live and kept bytes never pass the budget.
TEST(ComputeArena, KeepsReleasedBuffersForReuseWithinTheBudget) {
  ComputeArena arena(6 * kPage, kPage);
  std::byte* a = arena.allocate(2 * kPage);
  std::byte* b = arena.allocate(2 * kPage);
  EXPECT_EQ(arena.maps(), 2);
  a[0] = std::byte{7};
  arena.release(a, 2 * kPage);
  EXPECT_EQ(arena.live_bytes(), 2 * kPage);
  EXPECT_EQ(arena.mapped_bytes(), 4 * kPage);
  std::byte* c = arena.allocate(2 * kPage);
  EXPECT_EQ(c, a);  // the kept buffer, bytes and all
  EXPECT_EQ(c[0], std::byte{7});
  EXPECT_EQ(arena.maps(), 2);
  arena.release(b, 2 * kPage);
  arena.release(c, 2 * kPage);
  EXPECT_EQ(arena.live_bytes(), 0);
  EXPECT_EQ(arena.mapped_bytes(), 4 * kPage);
  // Three pages: 4 kept + 3 > 6, so the oldest kept buffer goes back.
  std::byte* d = arena.allocate(3 * kPage);
  EXPECT_EQ(arena.maps(), 3);
  EXPECT_EQ(arena.mapped_bytes(), 5 * kPage);
  EXPECT_LE(arena.mapped_bytes(), 6 * kPage);
  // The whole budget in one buffer: every kept buffer goes back.
  arena.release(d, 3 * kPage);
  std::byte* e = arena.allocate(6 * kPage);
  EXPECT_EQ(arena.mapped_bytes(), 6 * kPage);
  EXPECT_EQ(arena.live_bytes(), 6 * kPage);
  arena.release(e, 6 * kPage);
}

// After the first iteration a plan's loads find kept buffers: with chunks
// of one size (the chunks plugin's fp32 layout) later iterations map no
// new pages; with two sizes (its bf16 and fp16 layout: 2-byte kinds in
// chunks of half the bytes) most loads still reuse.
TEST(ChunkExecutor, LaterIterationsMapNoNewPages) {
  for (int sizes : {1, 2}) {
    const AccessTrace trace = random_trace(29, 30, 60, sizes);
    const Plan plan = plan_auto(trace, quarter_budget(trace));
    ASSERT_GT(plan.bytes_evicted, 0);
    ChunkExecutor exec(trace, plan, options_for(LowerTier::kHost, ""));
    run_iterations(exec, trace, 1);
    const int64_t after_one = exec.arena().maps();
    run_iterations(exec, trace, 2);
    EXPECT_LE(exec.arena().mapped_bytes(), plan.budget_bytes);
    int64_t loads = 0;
    for (const StepMoves& m : plan.steps) {
      loads += static_cast<int64_t>(m.load.size() + m.prefetch.size());
    }
    loads *= 2;
    const int64_t later = exec.arena().maps() - after_one;
    const std::string what = std::to_string(sizes) + " size(s): " + std::to_string(after_one) +
                             " mappings in the first iteration, " + std::to_string(later) +
                             " in the next two, which loaded " + std::to_string(loads) + " chunks";
    if (sizes == 1) {
      EXPECT_EQ(later, 0) << what;
    } else {
      EXPECT_LT(later, loads / 2) << what;
    }
  }
}

int64_t current_rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// What the process may hold beyond the arena's live bytes while the
// executor runs: the I/O threads' stacks as far as touched, the trace, plan
// and bookkeeping, allocator slack. The chunk-sized staging buffer that
// carries the initial contents to the NVMe slots is freed before the first
// step, so it adds to the peak only when a chunk exceeds the arena's peak.
// Measured: 0.8 to 0.9 MiB over four runs (64 chunks of 4 MiB, 80 steps, 4 I/O threads, glibc);
// the bound leaves room for another allocator or libc and is still under
// two chunks, so one chunk buffer leaked per step would fail it.
constexpr int64_t kRssOverheadBytes = 8ll << 20;

TEST(ChunkExecutor, PeakRssStaysWithinBudgetPlusOverhead) {
#if KOLOS_TEST_ASAN
  // ASan keeps freed host memory in its quarantine and maps shadow memory,
  // both counted in the resident set; the bound holds for the allocator the
  // library runs with, so it is checked in the plain build only.
  GTEST_SKIP() << "resident memory is not comparable under AddressSanitizer";
#endif
  // 64 chunks of 4 MiB (256 MiB) on NVMe through a 64 MiB arena.
  constexpr int64_t kChunk = 4ll << 20;
  constexpr int64_t kBudget = 64ll << 20;
  AccessTrace trace = random_trace(99, 64, 80, 1, kChunk);
  ASSERT_GE(total_bytes(trace), 4 * kBudget);
  const Plan plan = plan_auto(trace, kBudget);
  TempDir dir;

  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    std::ostringstream out;
    int rc = 0;
    try {
      const int64_t before_kib = current_rss_kib();
      int64_t peak_kib = 0;
      int64_t arena_peak = 0;
      std::vector<std::byte> got;
      bool equal = true;
      {
        ChunkExecutor exec(trace, plan, options_for(LowerTier::kNvme, dir.path()));
        run_iterations(exec, trace, 1);
        exec.flush();
        struct rusage usage {};
        ::getrusage(RUSAGE_SELF, &usage);
        peak_kib = usage.ru_maxrss;
        arena_peak = exec.arena().peak_bytes();
        // Check the bytes one chunk at a time (a full reference would be
        // 256 MiB): the chunk's own updates replayed on its initial bytes.
        std::vector<std::byte> want(static_cast<std::size_t>(kChunk));
        got.resize(static_cast<std::size_t>(kChunk));
        for (ChunkId id = 0; id < trace.chunks.size() && equal; ++id) {
          init_chunk(id, want.data(), kChunk);
          for (std::size_t s = 0; s < trace.steps.size(); ++s) {
            for (ChunkId c : trace.steps[s]) {
              if (c == id) update_chunk(0, s, id, want.data(), kChunk);
            }
          }
          exec.read_chunk(id, got.data());
          equal = std::memcmp(want.data(), got.data(), want.size()) == 0;
          if (!equal) out << "chunk " << id << " differs ";
        }
      }
      out << before_kib << " " << peak_kib << " " << arena_peak << " " << (equal ? 1 : 0);
    } catch (const std::exception& e) {
      out << "error " << e.what();
      rc = 1;
    }
    const std::string text = out.str();
    ssize_t ignored = ::write(pipe_fds[1], text.data(), text.size());
    (void)ignored;
    ::close(pipe_fds[1]);
    ::_exit(rc);
  }
  ::close(pipe_fds[1]);
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;

  std::istringstream in(text);
  int64_t before_kib = 0, peak_kib = 0, arena_peak = 0;
  int equal = 0;
  ASSERT_TRUE(in >> before_kib >> peak_kib >> arena_peak >> equal) << text;
  EXPECT_EQ(equal, 1) << text;
  const int64_t grown = (peak_kib - before_kib) * 1024;
  std::cout << "RSS before " << before_kib << " KiB, peak " << peak_kib << " KiB, grown "
            << grown / 1024 << " KiB; arena peak " << arena_peak / 1024 << " KiB; overhead "
            << (grown - arena_peak) / 1024 << " KiB\n";
  EXPECT_LE(arena_peak, kBudget);
  EXPECT_LE(grown, kBudget + kRssOverheadBytes);
  // The measurement sees the arena at all (else the bound above proves
  // nothing): the arena's peak was close to the budget and was touched.
  EXPECT_GE(arena_peak, kBudget / 2);
  EXPECT_GE(grown, arena_peak / 2);
}

}  // namespace
