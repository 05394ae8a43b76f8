// The NVMe store's write and read throughput with every slot in flight at
// once through its I/O thread pool. bench/run_nvme_bench.sh runs it next to
// dd's direct-I/O sequential bandwidth on the same directory and size.
//
//   nvme_bench --dir D [--mib 1024] [--slot-mib 16] [--threads 4]
//
// Prints one "key: value" line each (the script parses them): the setup,
// "store write MiB/s", "store read MiB/s", and "verify: ok" once every slot
// read back bit-equal to what was written.
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
#include "kolos/memory/nvme_store.h"

namespace {

using Clock = std::chrono::steady_clock;
using kolos::memory::AlignedBuffer;

void fill(std::byte* p, int64_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "nvme_bench: %s\nusage: nvme_bench --dir D [--mib 1024] [--slot-mib 16] "
               "[--threads 4]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int64_t total_mib = 1024, slot_mib = 16;
  int threads = 4;
  kolos::bench::Options(usage)
      .add("--dir", &dir)
      .add("--mib", &total_mib)
      .add("--slot-mib", &slot_mib)
      .add("--threads", &threads)
      .parse(argc, argv);
  if (dir.empty()) usage("--dir is required");
  if (slot_mib <= 0 || total_mib < slot_mib || total_mib % slot_mib != 0) {
    usage("--mib must be a positive multiple of --slot-mib");
  }
  try {
    const int64_t slot_bytes = slot_mib << 20;
    const int64_t slots = total_mib / slot_mib;
    kolos::memory::NvmeOptions options;
    options.dir = dir;
    options.threads = threads;
    kolos::memory::NvmeStore store(options, slot_bytes, slots);
    std::printf("setup: %lld slots of %lld MiB = %lld MiB, %d I/O threads, %s, alignment %lld\n",
                static_cast<long long>(slots), static_cast<long long>(slot_mib),
                static_cast<long long>(total_mib), threads,
                store.direct_io() ? "direct I/O" : "buffered I/O",
                static_cast<long long>(store.alignment()));

    std::vector<AlignedBuffer> buffers;
    for (int64_t i = 0; i < slots; ++i) {
      buffers.push_back(kolos::memory::allocate_aligned(slot_bytes, store.alignment()));
      fill(buffers.back().get(), slot_bytes, static_cast<uint64_t>(i));
    }
    std::vector<std::future<void>> pending;
    const auto w0 = Clock::now();
    for (int64_t i = 0; i < slots; ++i) pending.push_back(store.write(i, buffers[i].get()));
    for (auto& f : pending) f.get();
    const double write_s = std::chrono::duration<double>(Clock::now() - w0).count();
    pending.clear();

    for (auto& b : buffers) std::memset(b.get(), 0, static_cast<std::size_t>(slot_bytes));
    const auto r0 = Clock::now();
    for (int64_t i = 0; i < slots; ++i) pending.push_back(store.read(i, buffers[i].get()));
    for (auto& f : pending) f.get();
    const double read_s = std::chrono::duration<double>(Clock::now() - r0).count();

    AlignedBuffer expected = kolos::memory::allocate_aligned(slot_bytes, store.alignment());
    for (int64_t i = 0; i < slots; ++i) {
      fill(expected.get(), slot_bytes, static_cast<uint64_t>(i));
      if (std::memcmp(expected.get(), buffers[i].get(), static_cast<std::size_t>(slot_bytes))) {
        std::printf("verify: slot %lld differs\n", static_cast<long long>(i));
        return 1;
      }
    }
    std::printf("store write seconds: %.4f\n", write_s);
    std::printf("store write MiB/s: %.1f\n", static_cast<double>(total_mib) / write_s);
    std::printf("store read seconds: %.4f\n", read_s);
    std::printf("store read MiB/s: %.1f\n", static_cast<double>(total_mib) / read_s);
    std::printf("verify: ok\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvme_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
