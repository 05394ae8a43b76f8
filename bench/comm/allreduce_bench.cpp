// bench_allreduce: ProcessGroup::all_reduce (enqueue + wait) against a raw
// MPI_Allreduce on the same buffer, float32 sum, 4 KiB .. 64 MiB.
//
//   mpirun -np 2 bench_allreduce [max_bytes [rounds [inline_max_bytes [fixed]]]]
//
// Three paths reduce in place over the same ranks: raw MPI on its own
// duplicate of MPI_COMM_WORLD; kolos as configured (collectives up to
// inline_max_bytes, default detail::kDefaultInlineMaxBytes, run inline in
// the caller's thread when the group is idle, larger ones on the
// communication thread); and kolos with every collective sent to the
// communication thread ("thread": inline execution off), which shows what
// the hand-off costs. Each size runs a warm-up, then `rounds` rounds
// (default 18) of the three paths; a round's time is the slowest rank's, and
// the table shows each path's median round. "ratio" is raw time / kolos time
// (1.0 = no overhead); bandwidth is algorithm bandwidth, bytes / time.
//
// On a machine shared with other work the paths must start alike: a block
// of ranks that busy-poll inside MPI (raw, and kolos inline) right after
// another such block has used up its scheduler credit and is preempted for
// time slices (milliseconds), while a block right after the thread path
// (whose callers sleep) is not. Measured here at a load average of 6, with
// the order cycling raw-kolos-thread, the path timed right after the
// thread path came out 3x faster than the one timed two blocks later, for
// the same MPI call. So every block starts after a 20 ms sleep, and the
// rounds go through all six orders of the paths (18 rounds by default:
// each order three times). "slow r/k/t" counts, per path, the rounds that
// took more than twice the path's median (preempted, typically); "best k / t"
// are the ratios of the fastest rounds (raw's best / kolos's best, raw's
// best / thread's best), the least disturbed by other work. `fixed`
// as the fourth argument keeps the order raw-kolos-thread, without sleeps,
// as this benchmark ran before.
#include <ATen/ATen.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kolos/core/comm/mpi.h"

namespace {

constexpr int kDefaultRounds = 18;
// Sleep before each timed block, so that every block starts alike.
constexpr auto kPauseBeforeBlock = std::chrono::milliseconds(20);
constexpr int kWarmup = 3;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Rounds that took more than twice the median: preempted, typically.
int slow_rounds(const std::vector<double>& times, double median_s) {
  return static_cast<int>(
      std::count_if(times.begin(), times.end(), [&](double t) { return t > 2 * median_s; }));
}

// Iterations per round: enough to time small messages, few for large ones.
int iterations_for(int64_t bytes) {
  return static_cast<int>(std::clamp<int64_t>((int64_t{64} << 20) / bytes, 4, 200));
}

// Seconds per iteration of `body`, the slowest rank's.
template <typename Body>
double time_per_iteration(MPI_Comm comm, int iterations, bool pause, Body&& body) {
  if (pause) std::this_thread::sleep_for(kPauseBeforeBlock);
  MPI_Barrier(comm);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) body();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double slowest = 0;
  MPI_Allreduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return slowest / iterations;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS ||
      provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "bench_allreduce: MPI_THREAD_MULTIPLE is not available\n");
    return 1;
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int64_t max_bytes = argc > 1 ? std::atoll(argv[1]) : (int64_t{64} << 20);
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : kDefaultRounds;
  const int64_t inline_max =
      argc > 3 ? std::atoll(argv[3]) : kolos::comm::detail::kDefaultInlineMaxBytes;
  const bool fixed_order = argc > 4 && std::strcmp(argv[4], "fixed") == 0;
  const bool pause = !fixed_order;
  // Every order of raw (0), kolos (1) and thread (2).
  constexpr int kOrders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  kolos::comm::detail::set_inline_max_bytes(inline_max);
  int rc = 0;
  {
    MPI_Comm raw_comm = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw_comm);
    kolos::comm::ProcessGroupPtr pg = kolos::comm::make_mpi_process_group(MPI_COMM_WORLD, "bench");
    if (rank == 0) {
      const char* pml = std::getenv("OMPI_MCA_pml");
      std::printf(
          "all_reduce float32 sum, %d ranks, median of %d rounds (%s orders); MPI pml: %s; "
          "kolos inline limit %lld bytes\n",
          size, rounds, fixed_order ? "fixed" : "all six", pml ? pml : "default (not set)",
          static_cast<long long>(inline_max));
      std::printf("%10s %7s %10s %10s %10s %9s %10s %8s %8s %11s %9s\n", "size", "iters", "raw us",
                  "kolos us", "thread us", "raw GB/s", "kolos GB/s", "ratio", "thread",
                  "best k / t", "slow r/k/t");
    }
    // Every size the inline limit may plausibly sit at, then x4 steps.
    std::vector<int64_t> sizes = {4 << 10, 16 << 10, 32 << 10, 48 << 10, 64 << 10, 128 << 10};
    for (int64_t bytes = 256 << 10; bytes <= max_bytes; bytes *= 4) sizes.push_back(bytes);
    for (const int64_t bytes : sizes) {
      if (bytes > max_bytes) break;
      at::Tensor t = at::zeros({bytes / 4}, at::kFloat);  // zeros: sums stay finite
      float* data = t.data_ptr<float>();
      const int count = static_cast<int>(t.numel());
      auto raw = [&] {
        if (MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, raw_comm) != MPI_SUCCESS) {
          rc = 1;
        }
      };
      auto kolos = [&] { pg->all_reduce(t)->wait(); };
      // The same group with inline execution off: every call goes through
      // the communication thread.
      auto thread = [&] {
        const int64_t previous = kolos::comm::detail::set_inline_max_bytes(-1);
        pg->all_reduce(t)->wait();
        kolos::comm::detail::set_inline_max_bytes(previous);
      };
      const int iterations = iterations_for(bytes);
      for (int i = 0; i < kWarmup; ++i) {
        raw();
        kolos();
        thread();
      }
      std::vector<double> raw_times, kolos_times, thread_times;
      for (int round = 0; round < rounds; ++round) {
        for (int k = 0; k < 3; ++k) {
          switch (fixed_order ? k : kOrders[round % 6][k]) {
            case 0:
              raw_times.push_back(time_per_iteration(raw_comm, iterations, pause, raw));
              break;
            case 1:
              kolos_times.push_back(time_per_iteration(raw_comm, iterations, pause, kolos));
              break;
            default:
              thread_times.push_back(time_per_iteration(raw_comm, iterations, pause, thread));
          }
        }
      }
      const double raw_s = median(raw_times), kolos_s = median(kolos_times),
                   thread_s = median(thread_times);
      const std::string slow = std::to_string(slow_rounds(raw_times, raw_s)) + "/" +
                               std::to_string(slow_rounds(kolos_times, kolos_s)) + "/" +
                               std::to_string(slow_rounds(thread_times, thread_s));
      if (rank == 0) {
        std::string label = bytes >= (1 << 20) ? std::to_string(bytes >> 20) + " MiB"
                                               : std::to_string(bytes >> 10) + " KiB";
        const auto best = [](const std::vector<double>& v) {
          return *std::min_element(v.begin(), v.end());
        };
        char best_ratios[32];
        std::snprintf(best_ratios, sizeof best_ratios, "%.2f / %.2f",
                      best(raw_times) / best(kolos_times), best(raw_times) / best(thread_times));
        std::printf("%10s %7d %10.1f %10.1f %10.1f %9.3f %10.3f %8.2f %8.2f %11s %9s\n",
                    label.c_str(), iterations, raw_s * 1e6, kolos_s * 1e6, thread_s * 1e6,
                    bytes / raw_s / 1e9, bytes / kolos_s / 1e9, raw_s / kolos_s, raw_s / thread_s,
                    best_ratios, slow.c_str());
        std::fflush(stdout);
      }
    }
    pg.reset();  // the group goes before MPI_Finalize
    MPI_Comm_free(&raw_comm);
  }
  MPI_Finalize();
  return rc;
}
