// AdamW streamed over states on the NVMe tier against the same step in
// memory and against the store's raw I/O on the same bytes, in one run.
// bench/run_streamed_adamw_bench.sh runs it.
//
//   streamed_adamw_bench --dir D [--mib 256] [--chunk-mib 16] [--steps 3]
//                        [--prefetch 1] [--io-threads 4] [--kernel-threads 0]
//
// N MiB of fp32 parameters: param, grad, exp_avg and exp_avg_sq (N MiB
// each, 4N in host memory) for the in-memory step, and param, exp_avg and
// exp_avg_sq in 3 N/C slots of C MiB for the streamed one (grad stays in
// memory). Timed, each as the mean over --steps steps:
//   memory    adamw_step_fp32 on the four arrays in memory
//   streamed  StreamedAdamW::step on the states in the store
//   io floor  the store writing every slot, then reading every slot (all
//             requests queued at once), on the same bytes: 3N written and 3N
//             read, what a streamed step must move
// The streamed states are then downloaded and compared with the in-memory
// ones bit for bit ("verify: ok"). Prints "key: value" lines the script
// parses.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "bench_options.h"
#include "kolos/kernels/adamw.h"
#include "kolos/memory/nvme_store.h"
#include "kolos/memory/streamed_adamw.h"

namespace {

using Clock = std::chrono::steady_clock;
using kolos::memory::AlignedBuffer;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void fill(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < n; ++i) p[i] = dist(rng);
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "streamed_adamw_bench: %s\nusage: streamed_adamw_bench --dir D [--mib 256] "
               "[--chunk-mib 16] [--steps 3] [--prefetch 1] [--io-threads 4] "
               "[--kernel-threads 0]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int64_t mib = 256, chunk_mib = 16;
  int steps = 3, prefetch = 1, io_threads = 4, kernel_threads = 0;
  kolos::bench::Options(usage)
      .add("--dir", &dir)
      .add("--mib", &mib)
      .add("--chunk-mib", &chunk_mib)
      .add("--steps", &steps)
      .add("--prefetch", &prefetch)
      .add("--io-threads", &io_threads)
      .add("--kernel-threads", &kernel_threads)
      .parse(argc, argv);
  if (dir.empty()) usage("--dir is required");
  if (chunk_mib <= 0 || mib < chunk_mib || mib % chunk_mib != 0) {
    usage("--mib must be a positive multiple of --chunk-mib");
  }
  if (steps < 1) usage("--steps must be >= 1");
  try {
    const int64_t bytes = mib << 20, chunk_bytes = chunk_mib << 20;
    const int64_t numel = bytes / 4, chunk_numel = chunk_bytes / 4, chunks = mib / chunk_mib;
    auto alloc = [&] { return kolos::memory::allocate_aligned(bytes); };
    AlignedBuffer param = alloc(), grad = alloc(), m = alloc(), v = alloc();
    auto f = [](const AlignedBuffer& b) { return reinterpret_cast<float*>(b.get()); };
    fill(f(param), numel, 1, -1.0f, 1.0f);
    fill(f(grad), numel, 2, -1.0f, 1.0f);
    fill(f(m), numel, 3, -0.01f, 0.01f);
    fill(f(v), numel, 4, 0.0f, 1e-4f);

    kolos::memory::NvmeOptions store_options;
    store_options.dir = dir;
    store_options.threads = io_threads;
    kolos::memory::NvmeStore store(store_options, chunk_bytes,
                                   kolos::memory::StreamedAdamW::slots_needed(numel, chunk_numel));
    kolos::memory::StreamedAdamWOptions options;
    options.numel = numel;
    options.chunk_numel = chunk_numel;
    options.prefetch = prefetch;
    options.kernel_threads = kernel_threads;
    kolos::memory::StreamedAdamW streamed(store, options);
    std::printf(
        "setup: %lld MiB of fp32 parameters, %lld chunks of %lld MiB, prefetch %d "
        "(%lld MiB of buffers), %d I/O threads, %s, kernel threads %d (0: all)\n",
        static_cast<long long>(mib), static_cast<long long>(chunks),
        static_cast<long long>(chunk_mib), prefetch,
        static_cast<long long>(streamed.max_host_bytes() >> 20), io_threads,
        store.direct_io() ? "direct I/O" : "buffered I/O", kernel_threads);
    streamed.upload(f(param), f(m), f(v));

    kolos::kernels::AdamWConfig config;
    config.lr = 1e-3;
    config.weight_decay = 0.01;

    // Streamed first, then in memory: both start from the same states.
    const auto s0 = Clock::now();
    for (int s = 1; s <= steps; ++s) {
      config.step = s;
      streamed.step(f(grad), config);
    }
    const double streamed_s = seconds_since(s0) / steps;
    const auto m0 = Clock::now();
    for (int s = 1; s <= steps; ++s) {
      config.step = s;
      kolos::kernels::adamw_step_fp32(f(param), f(grad), f(m), f(v), numel, config, kernel_threads);
    }
    const double memory_s = seconds_since(m0) / steps;

    // The streamed states, for the comparison and as the floor's buffers.
    AlignedBuffer sp = alloc(), sm = alloc(), sv = alloc();
    streamed.download(f(sp), f(sm), f(sv));
    if (std::memcmp(param.get(), sp.get(), bytes) != 0 || std::memcmp(m.get(), sm.get(), bytes) ||
        std::memcmp(v.get(), sv.get(), bytes)) {
      std::printf("verify: the streamed states differ from the in-memory ones\n");
      return 1;
    }

    // The I/O floor: the same slots, all written then all read, --steps times.
    std::byte* arrays[3] = {sp.get(), sm.get(), sv.get()};
    double write_s = 0, read_s = 0;
    // Every slot in flight at once; the seconds until all are done.
    const auto all_slots = [&](auto io) {
      const auto t0 = Clock::now();
      std::vector<std::future<void>> pending;
      for (int64_t c = 0; c < chunks; ++c) {
        for (int a = 0; a < 3; ++a) pending.push_back(io(3 * c + a, arrays[a] + c * chunk_bytes));
      }
      for (auto& p : pending) p.get();
      return seconds_since(t0);
    };
    for (int s = 0; s < steps; ++s) {
      write_s += all_slots([&](int64_t slot, std::byte* data) { return store.write(slot, data); });
      read_s += all_slots([&](int64_t slot, std::byte* data) { return store.read(slot, data); });
    }
    write_s /= steps;
    read_s /= steps;
    const double floor_s = write_s + read_s;

    std::printf("memory step seconds: %.4f\n", memory_s);
    std::printf("streamed step seconds: %.4f\n", streamed_s);
    std::printf("io write seconds: %.4f (%.1f MiB/s)\n", write_s, 3.0 * mib / write_s);
    std::printf("io read seconds: %.4f (%.1f MiB/s)\n", read_s, 3.0 * mib / read_s);
    std::printf("io floor seconds: %.4f\n", floor_s);
    std::printf("buffer sets allocated: %lld of %lld\n",
                static_cast<long long>(streamed.buffer_sets_allocated()),
                static_cast<long long>(streamed.max_buffer_sets()));
    std::printf("verify: ok\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "streamed_adamw_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
