// StreamedAdamW: AdamW over states held in NvmeStore slots gives the bits of
// the fused kernel on the same arrays in memory, names the chunk of an I/O
// error, and never holds more buffer sets than it documents.
#include "kolos/memory/streamed_adamw.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/kernels/adamw.h"
#include "kolos/memory/nvme_store.h"
#include "memory_test_support.h"

namespace fs = std::filesystem;
using kolos::kernels::AdamWConfig;
using kolos::memory::NvmeStore;
using kolos::memory::StreamedAdamW;
using kolos::memory::StreamedAdamWOptions;

namespace {

using kolos::memory::testing::error_of;
using kolos::memory::testing::nvme_options;
using kolos::memory::testing::TempDir;

// `numel` floats in chunks of `chunk_numel`, `prefetch` chunks read ahead.
StreamedAdamWOptions adamw_options(int64_t numel, int64_t chunk_numel, int prefetch = 1) {
  StreamedAdamWOptions options;
  options.numel = numel;
  options.chunk_numel = chunk_numel;
  options.prefetch = prefetch;
  return options;
}

std::vector<float> random_floats(int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(static_cast<size_t>(n));
  for (auto& x : out) x = dist(rng);
  return out;
}

constexpr int64_t kSlotBytes = 256 * 1024;  // 65536 floats

struct Case {
  int64_t chunk_numel;
  int prefetch;
};

class StreamedAdamWBitEqual : public ::testing::TestWithParam<Case> {};

// Three steps (bias correction at steps 1, 2, 3) with weight decay and a
// grad_scale, on 9 chunks whose last is partial (about 7 MiB of states):
// every bit of param, exp_avg and exp_avg_sq equals adamw_step_fp32 on the
// same arrays in memory. Step 2 passes one gradient pointer per chunk.
TEST_P(StreamedAdamWBitEqual, ThreeStepsMatchTheInMemoryKernel) {
  const Case c = GetParam();
  const int64_t numel = 8 * c.chunk_numel + 12345;
  TempDir dir;
  const int64_t chunks = (numel + c.chunk_numel - 1) / c.chunk_numel;
  ASSERT_EQ(chunks, 9);
  NvmeStore store(nvme_options(dir.path()), kSlotBytes,
                  StreamedAdamW::slots_needed(numel, c.chunk_numel) + 2);
  StreamedAdamWOptions options = adamw_options(numel, c.chunk_numel, c.prefetch);
  options.first_slot = 2;  // slots before ours belong to someone else
  StreamedAdamW streamed(store, options);
  ASSERT_EQ(streamed.chunks(), 9);
  EXPECT_EQ(streamed.chunk_numel(8), 12345);

  std::vector<float> param = random_floats(numel, 1, -1.0f, 1.0f);
  std::vector<float> m = random_floats(numel, 2, -0.01f, 0.01f);
  std::vector<float> v = random_floats(numel, 3, 0.0f, 1e-4f);
  streamed.upload(param.data(), m.data(), v.data());

  AdamWConfig config;
  config.lr = 1e-2;
  config.weight_decay = 0.05;
  config.grad_scale = 0.5;
  for (int64_t step = 1; step <= 3; ++step) {
    config.step = step;
    const std::vector<float> grad = random_floats(numel, 100 + step, -2.0f, 2.0f);
    kolos::kernels::adamw_step_fp32(param.data(), grad.data(), m.data(), v.data(), numel, config);
    if (step == 2) {
      std::vector<const float*> per_chunk;
      for (int64_t k = 0; k < chunks; ++k) per_chunk.push_back(grad.data() + k * c.chunk_numel);
      streamed.step(per_chunk.data(), config);
    } else {
      streamed.step(grad.data(), config);
    }
  }

  std::vector<float> p2(numel), m2(numel), v2(numel);
  streamed.download(p2.data(), m2.data(), v2.data());
  const size_t bytes = static_cast<size_t>(numel) * sizeof(float);
  EXPECT_EQ(std::memcmp(param.data(), p2.data(), bytes), 0) << "param";
  EXPECT_EQ(std::memcmp(m.data(), m2.data(), bytes), 0) << "exp_avg";
  EXPECT_EQ(std::memcmp(v.data(), v2.data(), bytes), 0) << "exp_avg_sq";
  // The states moved: a step that did nothing would not match above, but
  // make the failure obvious.
  EXPECT_NE(std::memcmp(param.data(), random_floats(numel, 1, -1.0f, 1.0f).data(), bytes), 0);
}

INSTANTIATE_TEST_SUITE_P(Chunks, StreamedAdamWBitEqual,
                         ::testing::Values(Case{65536, 1},   // chunk fills its slot
                                           Case{60000, 0},   // slot tail unused, no read-ahead
                                           Case{65536, 3}),  // deeper read-ahead
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "chunk" + std::to_string(info.param.chunk_numel) + "_prefetch" +
                                  std::to_string(info.param.prefetch);
                         });

// A read that fails in an I/O thread (the store's file is cut short behind
// its back, in the middle of chunk 5's slots) surfaces from step() as a
// kolos::Error naming the chunk, the array, the slot and the store's own
// message; the object is left usable (its destructor does not hang) and no
// buffer set leaked past the bound.
TEST(StreamedAdamW, IoErrorNamesTheChunk) {
  TempDir dir;
  const int64_t chunk_numel = 65536, numel = 8 * chunk_numel + 100;
  NvmeStore store(nvme_options(dir.path()), kSlotBytes,
                  StreamedAdamW::slots_needed(numel, chunk_numel));
  StreamedAdamW streamed(store, adamw_options(numel, chunk_numel, 2));
  const std::vector<float> zeros(numel, 0.0f);
  streamed.upload(zeros.data(), zeros.data(), zeros.data());
  // Chunk 5 holds slots 15, 16, 17: keep slot 15 whole, cut into slot 16.
  ASSERT_EQ(::truncate(store.file().c_str(), 16 * kSlotBytes + 4096), 0);

  AdamWConfig config;
  const std::vector<float> grad(numel, 1.0f);
  const std::string message = error_of([&] { streamed.step(grad.data(), config); });
  EXPECT_NE(message.find("StreamedAdamW::step: chunk 5 of 9"), std::string::npos) << message;
  EXPECT_NE(message.find("read of exp_avg (slot 16)"), std::string::npos) << message;
  EXPECT_NE(message.find(store.file()), std::string::npos) << message;
  EXPECT_LE(streamed.buffer_sets_allocated(), streamed.max_buffer_sets());
}

// A step before any upload reads slots never written: refused at the read
// call by the store, and reported with the first chunk.
TEST(StreamedAdamW, StepBeforeUploadNamesChunkZero) {
  TempDir dir;
  NvmeStore store(nvme_options(dir.path()), kSlotBytes, 6);
  StreamedAdamW streamed(store, adamw_options(70000, 65536));
  const std::vector<float> grad(70000, 1.0f);
  const std::string message = error_of([&] { streamed.step(grad.data(), AdamWConfig{}); });
  EXPECT_NE(message.find("chunk 0 of 2"), std::string::npos) << message;
  EXPECT_NE(message.find("read of param (slot 0)"), std::string::npos) << message;
}

// Buffer sets are allocated only when every set is held by a chunk in
// flight, so the number allocated is the most ever in flight. Through
// upload, three steps and a download it never passes prefetch + 2, and it
// reaches it: the write-back of chunk i-1 was in flight while chunk i was
// updated and chunks i+1 .. i+prefetch were read.
TEST(StreamedAdamW, BufferSetsInFlightStayWithinTheBound) {
  for (int prefetch : {0, 1, 2, 4}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    TempDir dir;
    const int64_t chunk_numel = 65536, numel = 8 * chunk_numel + 7;
    NvmeStore store(nvme_options(dir.path()), kSlotBytes,
                    StreamedAdamW::slots_needed(numel, chunk_numel));
    StreamedAdamW streamed(store, adamw_options(numel, chunk_numel, prefetch));
    EXPECT_EQ(streamed.max_buffer_sets(), prefetch + 2);
    EXPECT_EQ(streamed.max_host_bytes(), (prefetch + 2) * 3 * kSlotBytes);
    EXPECT_EQ(streamed.buffer_sets_allocated(), 0);

    std::vector<float> p = random_floats(numel, 5, -1.0f, 1.0f);
    std::vector<float> zeros(numel, 0.0f);
    streamed.upload(p.data(), zeros.data(), zeros.data());
    EXPECT_LE(streamed.buffer_sets_allocated(), streamed.max_buffer_sets());
    AdamWConfig config;
    for (int64_t step = 1; step <= 3; ++step) {
      config.step = step;
      streamed.step(p.data(), config);
      EXPECT_LE(streamed.buffer_sets_allocated(), streamed.max_buffer_sets());
      EXPECT_LE(streamed.peak_buffer_sets_in_use(), streamed.max_buffer_sets());
    }
    streamed.download(p.data(), zeros.data(), zeros.data());
    EXPECT_LE(streamed.buffer_sets_allocated(), streamed.max_buffer_sets());
    EXPECT_EQ(streamed.peak_buffer_sets_in_use(), streamed.buffer_sets_allocated());
    EXPECT_EQ(streamed.buffer_sets_allocated(), prefetch + 2);
  }
}

TEST(StreamedAdamW, BadOptionsAreRefused) {
  TempDir dir;
  NvmeStore store(nvme_options(dir.path()), kSlotBytes, 6);
  StreamedAdamWOptions options = adamw_options(100000, 65537);
  std::string message = error_of([&] { StreamedAdamW s(store, options); });
  EXPECT_NE(message.find("does not fit a slot of 262144 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("chunk_numel <= 65536"), std::string::npos) << message;

  options.chunk_numel = 30000;  // 4 chunks: 12 slots
  message = error_of([&] { StreamedAdamW s(store, options); });
  EXPECT_NE(message.find("4 chunks need slots 0..11 but the store has 6 slots"), std::string::npos)
      << message;

  options.chunk_numel = 65536;
  options.prefetch = -1;
  message = error_of([&] { StreamedAdamW s(store, options); });
  EXPECT_NE(message.find("prefetch must be >= 0"), std::string::npos) << message;
}

}  // namespace
