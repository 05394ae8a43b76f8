// ProcessGroup: collectives and point-to-point transfers on at::Tensor.
//
// Contract (as c10d's Work/ProcessGroup):
// - Every call is asynchronous: it enqueues the operation and returns a Work
//   handle at once. Operations of one group run in the order they were
//   enqueued, on one communication thread per group, so every rank must enqueue
//   the collectives of a group in the same order (as with MPI itself).
//   A backend may run a small collective in the caller's thread when the
//   group is idle (the MPI backend does, up to 64 KiB; see comm/mpi.h): the
//   call then returns with the Work complete, having waited for the group's
//   other ranks to issue it, and still never overtakes queued operations.
// - Tensors must be contiguous and must stay alive and untouched until the Work
//   completes (the Work keeps a reference to them).
// - Work::wait(timeout) blocks until the operation completes; it throws
//   kolos::CommError when the operation failed (naming the group, operation and
//   peer) or when the timeout expires first.
// - A backend that lacks an operation fails with its name and the operation's.
// - stats() counts what this rank sent, per operation, with the volume of the
//   bandwidth-optimal algorithm (ring for reductions/gathers, direct for
//   point-to-point and all_to_all, tree-free broadcast counted at the root):
//     all_reduce      2*(n-1)/n * bytes(tensor)
//     reduce          non-root: bytes(tensor); root 0
//     reduce_scatter  (n-1)/n * bytes(all inputs)            (even split)
//                     bytes(all inputs) - bytes(own input)   (general)
//     all_gather      bytes(input) * (n-1)
//     broadcast       root: bytes(tensor) * (n-1); others 0
//     all_to_all      bytes sent to other ranks
//     send            bytes(tensor); recv 0
//   so benchmarks can compare traffic with analytic formulas. The counts
//   come from the sizes the group was given, not from what reached MPI:
//   traffic tests observe MPI calls instead (tests/support/pmpi_count).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kolos::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* to_string(ReduceOp op);

enum class OpType : int {
  kAllReduce = 0,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kAllToAll,
  kSend,
  kRecv,
  kBarrier,
  kReduce,
  kCount
};
const char* to_string(OpType op);

// Default wait timeout: KOLOS_COMM_TIMEOUT_S from the environment, else 600 s.
std::chrono::milliseconds default_timeout();

class Work {
 public:
  virtual ~Work() = default;
  // True once the operation finished (successfully or not). Never blocks.
  virtual bool is_completed() const = 0;
  // Blocks until completion; throws CommError on failure or timeout.
  virtual void wait(std::chrono::milliseconds timeout = default_timeout()) = 0;
};
using WorkPtr = std::shared_ptr<Work>;

struct CommStats {
  std::array<uint64_t, static_cast<int>(OpType::kCount)> bytes{};  // bytes sent, per op
  std::array<uint64_t, static_cast<int>(OpType::kCount)> calls{};  // operations, per op
  uint64_t total_bytes() const;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Human-readable name, e.g. "world", "dp", "dp×sp"; used in every error.
  virtual const std::string& name() const = 0;
  virtual std::string backend() const = 0;

  // In place over all ranks.
  virtual WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // In place onto `root`: its tensor holds the reduction over all ranks
  // afterwards; the other ranks' tensors are left as they were.
  virtual WorkPtr reduce(const at::Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum);
  // `inputs[r]` is reduced over all ranks into `output` on rank r; sizes may
  // differ between r, and output.numel() == inputs[rank()].numel().
  virtual WorkPtr reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                 ReduceOp op = ReduceOp::kSum);
  // Even split: input.numel() == size() * output.numel(); chunk r goes to rank r.
  virtual WorkPtr reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                                      ReduceOp op = ReduceOp::kSum);
  // `outputs[r]` receives rank r's `input`; sizes may differ between ranks
  // (outputs[rank()].numel() == input.numel()).
  virtual WorkPtr all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input);
  // Even split: output.numel() == size() * input.numel(), rank r's at chunk r.
  virtual WorkPtr all_gather_flat(const at::Tensor& output, const at::Tensor& input);
  virtual WorkPtr broadcast(const at::Tensor& tensor, int root);
  // Split along dim 0 in rows: send in_splits[r] rows of `input` to rank r,
  // receive out_splits[r] rows from rank r. Empty splits: even split.
  virtual WorkPtr all_to_all(const at::Tensor& output, const at::Tensor& input,
                             const std::vector<int64_t>& out_splits = {},
                             const std::vector<int64_t>& in_splits = {});
  virtual WorkPtr send(const at::Tensor& tensor, int dst, int tag = 0);
  virtual WorkPtr recv(const at::Tensor& tensor, int src, int tag = 0);
  virtual WorkPtr barrier();

  // A new group of this group's ranks that pass the same `color`, ordered by
  // `key` (ties: by rank here), named `name`. Collective: every rank of this
  // group calls it, in the same order relative to its other collectives, and
  // waits for it; ranks that pass a negative color get nullptr. The new group
  // is independent: its operations never queue behind this group's.
  virtual std::shared_ptr<ProcessGroup> split(int64_t color, int64_t key, const std::string& name);

  virtual CommStats stats() const = 0;
  virtual void reset_stats() = 0;

 protected:
  [[noreturn]] void unsupported(const char* op) const;
};
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace kolos::comm
