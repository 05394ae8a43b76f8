// bench_allreduce: ProcessGroup::all_reduce (enqueue + wait) against a raw
// MPI_Allreduce on the same buffer, float32 sum, 4 KiB .. 64 MiB.
//
//   mpirun -np 2 bench_allreduce [max_bytes]
//
// Both paths reduce in place over the same ranks; raw MPI uses its own
// duplicate of MPI_COMM_WORLD, kolos the group's. Each size runs a warm-up,
// then kRounds rounds that alternate raw and kolos (so drift in machine load
// hits both alike); a round's time is the slowest rank's, and the table keeps
// each path's best round. Bandwidth is algorithm bandwidth: bytes / time.
// The difference between the two columns is the cost of the communication
// thread: queueing, a thread hand-off each way, and the Work's condvar.
#include <ATen/ATen.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kolos/core/comm/mpi.h"

namespace {

constexpr int kRounds = 5;
constexpr int kWarmup = 3;

// Iterations per round: enough to time small messages, few for large ones.
int iterations_for(int64_t bytes) {
  return static_cast<int>(std::clamp<int64_t>((int64_t{64} << 20) / bytes, 4, 200));
}

// Seconds per iteration of `body`, the slowest rank's.
template <typename Body>
double time_per_iteration(MPI_Comm comm, int iterations, Body&& body) {
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
  int rc = 0;
  {
    MPI_Comm raw_comm = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw_comm);
    kolos::comm::ProcessGroupPtr pg = kolos::comm::make_mpi_process_group(MPI_COMM_WORLD, "bench");
    if (rank == 0) {
      std::printf("all_reduce float32 sum, %d ranks, best of %d rounds (algorithm bandwidth)\n",
                  size, kRounds);
      std::printf("%10s %8s %12s %12s %12s %12s %8s\n", "size", "iters", "raw us", "kolos us",
                  "raw GB/s", "kolos GB/s", "ratio");
    }
    for (int64_t bytes = 4 << 10; bytes <= max_bytes; bytes *= 4) {
      at::Tensor t = at::zeros({bytes / 4}, at::kFloat);  // zeros: sums stay finite
      float* data = t.data_ptr<float>();
      const int count = static_cast<int>(t.numel());
      auto raw = [&] {
        if (MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, raw_comm) != MPI_SUCCESS) {
          rc = 1;
        }
      };
      auto kolos = [&] { pg->all_reduce(t)->wait(); };
      const int iterations = iterations_for(bytes);
      for (int i = 0; i < kWarmup; ++i) {
        raw();
        kolos();
      }
      double best_raw = 1e30, best_kolos = 1e30;
      for (int round = 0; round < kRounds; ++round) {
        best_raw = std::min(best_raw, time_per_iteration(raw_comm, iterations, raw));
        best_kolos = std::min(best_kolos, time_per_iteration(raw_comm, iterations, kolos));
      }
      if (rank == 0) {
        std::string label = bytes >= (1 << 20) ? std::to_string(bytes >> 20) + " MiB"
                                               : std::to_string(bytes >> 10) + " KiB";
        std::printf("%10s %8d %12.1f %12.1f %12.3f %12.3f %8.2f\n", label.c_str(), iterations,
                    best_raw * 1e6, best_kolos * 1e6, bytes / best_raw / 1e9,
                    bytes / best_kolos / 1e9, best_raw / best_kolos);
        std::fflush(stdout);
      }
    }
    pg.reset();  // the group goes before MPI_Finalize
    MPI_Comm_free(&raw_comm);
  }
  MPI_Finalize();
  return rc;
}
