// ProcessGroupNCCL: the ProcessGroup contract (kolos/core/comm/process_group.h)
// for CUDA tensors, over one NCCL communicator.
//
// - Made collectively over an MPI group (`control`): its rank 0 calls
//   ncclGetUniqueId, the id is broadcast over `control`, and every rank
//   calls ncclCommInitRank on the current device.
// - Every operation runs on the group's own stream, after the work already
//   queued on the caller's current stream (an event orders them), and
//   returns at once. Its Work completes when an event recorded after the
//   NCCL call has passed. Work::wait() makes the caller's current stream
//   wait for it and blocks the host until it completes or the deadline
//   passes; then the communicator is aborted (ncclCommAbort) and wait()
//   throws CommError. The watchdog sees every operation from enqueue to
//   completion and aborts every live communicator before it ends the job.
// - The tensors of an operation are recorded on the group's stream with
//   LibTorch's caching allocator, so their memory is not reused before the
//   operation finishes even if the caller drops them.
// - send/recv: NCCL matches point-to-point operations between two ranks in
//   the order they are issued; `tag` is not used, so both sides must issue
//   their transfers in the same order (kolos's schedules do).
// - reduce_scatter and all_gather with uneven sizes run as grouped
//   ncclReduce / ncclBroadcast calls, one per rank; all_to_all as grouped
//   ncclSend/ncclRecv.
#pragma once

#include <nccl.h>

#include <memory>
#include <string>

#include "kolos/core/comm/process_group.h"

namespace kolos::cuda {

// Collective over `control`. `device`: the CUDA device index the
// communicator uses (the rank's current device).
comm::ProcessGroupPtr make_nccl_group(const comm::ProcessGroupPtr& control, int device);

// ncclGetUniqueId as bytes (no GPU needed).
std::string nccl_unique_id();
std::string nccl_version();

// NCCL's data type for a LibTorch dtype; throws CommError for one NCCL has not.
ncclDataType_t nccl_type(at::ScalarType type);

}  // namespace kolos::cuda
