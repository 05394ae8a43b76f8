// The MPI backend of ProcessGroup (CPU tensors).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "kolos/core/comm/process_group.h"

namespace kolos::comm {

// Duplicates `comm` (the group owns its duplicate and frees it on
// destruction, which must happen before MPI_Finalize; the Runtime sees to
// that) and starts the group's communication thread on first use.
// Requires MPI initialised with MPI_THREAD_MULTIPLE.
//
// Collective over `comm` (it calls MPI_Comm_dup): every rank of `comm` must
// create the group, in the same order relative to other groups over `comm`.
// Throws kolos::CommError when MPI is not initialised with
// MPI_THREAD_MULTIPLE or the duplication fails.
ProcessGroupPtr make_mpi_process_group(MPI_Comm comm, std::string name);

namespace detail {
// Largest element count passed to one MPI call; INT_MAX (MPI counts are int)
// unless lowered. all_reduce, broadcast, send and recv split larger tensors
// into several MPI calls; all_gather, reduce_scatter and all_to_all reject
// them (their displacements are int too). Tests lower the limit to exercise
// the splitting with small tensors. Set it to the same value on every rank,
// with no operation in flight. Returns the previous limit; values < 1 or
// > INT_MAX are clamped.
int64_t set_max_mpi_count(int64_t count);

// Collectives whose message (the larger of the bytes handed to MPI and the
// bytes received) is at most this size run in the caller's thread when the
// group has nothing queued or running: the call returns with the Work
// already complete. Larger ones, and any issued while the group is busy, go
// to the communication thread. -1 sends everything to the thread. Returns
// the previous limit. Tests and benchmarks use it to compare both paths.
// 64 KiB: measured with bench_allreduce on 2 ranks (docs/performance.md,
// "ProcessGroup all_reduce vs raw MPI_Allreduce", for the commands), inline
// calls cost about 1 us more than raw MPI_Allreduce at every size from 4 to
// 64 KiB, with ob1 and with UCX, while the hand-off to the thread and back
// costs 5-10 us (64 KiB through the thread: 0.4-0.85 of raw). An inline
// call blocks its caller only as long as the MPI call itself (~20-40 us at
// 64 KiB here), so nothing worth overlapping is lost. An earlier finding
// that 64 KiB inline was several times slower than raw with ob1 was the
// benchmark's doing: it always timed kolos right after raw MPI, and on a
// loaded machine the second of two blocks of busy-polling ranks is the one
// the scheduler preempts for milliseconds.
constexpr int64_t kDefaultInlineMaxBytes = 64 << 10;
int64_t set_inline_max_bytes(int64_t bytes);
}  // namespace detail

}  // namespace kolos::comm
