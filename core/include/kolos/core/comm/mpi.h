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
// 32 KiB: with OpenMPI's default ob1 transport, 64 KiB all-reduces run
// inline were several times slower than the same call on the thread (and
// than raw MPI) in bench_allreduce, for reasons not found yet; up to 32 KiB
// (the shared-memory transport's eager range) inline wins on ob1 and UCX.
constexpr int64_t kDefaultInlineMaxBytes = 32 << 10;
int64_t set_inline_max_bytes(int64_t bytes);
}  // namespace detail

}  // namespace kolos::comm
