// Private to the MPI backend: the declaration of ProcessGroupMPI and of the
// types it queues and completes (MpiWork, Op, PendingTransfer). Its methods
// are defined in process_group_mpi.cpp (construction, queue, communication
// thread and point-to-point; the thread model is described there) and in
// process_group_mpi_collectives.cpp (collectives and argument checks).
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kolos/core/comm/counters.h"
#include "kolos/core/comm/process_group.h"
#include "mpi_support.h"

// Private to libkolos_core: not exported from the library.
#pragma GCC visibility push(hidden)
namespace kolos::comm::mpi_detail {

// ---- Work -------------------------------------------------------------------
// Completed exactly once, by the communication thread (or, for a collective
// run inline, by the caller's thread before the call returns). Holds the operation's
// tensors for its whole lifetime, so they outlive the transfer even when the
// caller drops its own references.
//
// The description that errors quote ("all_reduce(sum) of 1024 float32
// elements on group 'dp' (rank 0 of 2)") is built only when an error or a
// timeout needs it: formatting it costs about a microsecond, a sizeable part
// of a small collective.
using Describe = std::function<std::string()>;

class MpiWork final : public Work {
 public:
  MpiWork(Describe describe, std::vector<at::Tensor> tensors)
      : describe_(std::move(describe)), tensors_(std::move(tensors)) {}

  bool is_completed() const override { return done_.load(std::memory_order_acquire); }

  void wait(std::chrono::milliseconds timeout) override;

  void finish(std::exception_ptr error);

  // "recv from rank 1 (tag 0) on group 'world' (rank 0 of 2)"; thread-safe.
  const std::string& what() const;

 private:
  const Describe describe_;
  mutable std::once_flag what_once_;
  mutable std::string what_;
  const std::vector<at::Tensor> tensors_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

// Who a group is, for the descriptions of its operations; shared with the
// descriptions, which may be built after the group is gone.
struct GroupIdentity {
  std::string name;
  int rank = 0;
  int size = 1;
};

inline std::string describe_on(const GroupIdentity& id, const std::string& what) {
  return concat(what, " on group '", id.name, "' (rank ", id.rank, " of ", id.size, ")");
}

// One queued operation. Collectives carry `run`; point-to-point carries the
// fields after it and is posted by the communication thread.
struct Op {
  std::shared_ptr<MpiWork> work;
  OpType type = OpType::kBarrier;
  uint64_t bytes = 0;   // added to the byte counter on success
  bool counted = true;  // false: not an operation on tensors (split), not in stats()
  // Collectives: the whole blocking operation; the Work describes it in errors.
  std::function<void(const MpiWork&)> run;
  at::Tensor tensor;  // send/recv
  int peer = -1;
  int tag = 0;
};

// A posted send or recv, split into chunks of at most max_count() elements.
struct PendingTransfer {
  std::shared_ptr<MpiWork> work;
  uint64_t watch = 0;  // watchdog registration, from posting to completion
  OpType type = OpType::kSend;
  uint64_t bytes = 0;
  MPI_Datatype datatype = MPI_DATATYPE_NULL;
  std::vector<MPI_Request> requests;
  std::vector<int> expected;  // element count per chunk
  std::string error;          // first failure; reported when all chunks are done
};

// Pointer arithmetic on contiguous tensors.
inline char* bytes_of(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }
inline uint64_t nbytes(const at::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * t.element_size();
}

inline bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* a0 = bytes_of(a);
  const char* b0 = bytes_of(b);
  return a0 < b0 + nbytes(b) && b0 < a0 + nbytes(a);
}

// ---- the group --------------------------------------------------------------
class ProcessGroupMPI final : public ProcessGroup {
 public:
  ProcessGroupMPI(MPI_Comm parent, std::string name);

  ProcessGroupMPI(const ProcessGroupMPI&) = delete;
  ProcessGroupMPI& operator=(const ProcessGroupMPI&) = delete;

  // Runs the operations already queued (every rank queued them too), cancels
  // transfers still pending, joins the thread and frees the communicator.
  // Never throws.
  ~ProcessGroupMPI() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "mpi"; }

  CommStats stats() const override { return counters_.snapshot(); }
  void reset_stats() override { counters_.reset(); }

  // ---- collectives ----------------------------------------------------------

  WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  WorkPtr reduce(const at::Tensor& tensor, int root, ReduceOp op) override;
  WorkPtr reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                         ReduceOp op) override;
  WorkPtr reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                              ReduceOp op) override;
  WorkPtr all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input) override;
  WorkPtr all_gather_flat(const at::Tensor& output, const at::Tensor& input) override;
  WorkPtr broadcast(const at::Tensor& tensor, int root) override;
  WorkPtr all_to_all(const at::Tensor& output, const at::Tensor& input,
                     const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits) override;
  WorkPtr barrier() override;
  ProcessGroupPtr split(int64_t color, int64_t key, const std::string& name) override;

  // ---- point-to-point -------------------------------------------------------

  WorkPtr send(const at::Tensor& tensor, int dst, int tag) override;
  WorkPtr recv(const at::Tensor& tensor, int src, int tag) override;

 private:
  // ---- validation (caller's thread) -----------------------------------------

  std::string describe(const std::string& what) const;
  void check_tensor(const char* op, const at::Tensor& t, const char* label) const;
  void check_same_dtype(const char* op, const at::Tensor& a, const char* a_label,
                        const at::Tensor& b, const char* b_label) const;
  void check_reducible(const char* op, const at::Tensor& t, ReduceOp reduce) const;
  void check_list_size(const char* op, const std::vector<at::Tensor>& list,
                       const char* label) const;
  void check_rank(const char* op, int rank, const char* label) const;
  void check_count(const char* op, int64_t count, const char* label) const;
  static int64_t row_numel(const at::Tensor& t);
  std::vector<int64_t> splits_or_even(const char* op, const std::vector<int64_t>& splits,
                                      const at::Tensor& t, const char* label,
                                      const char* tensor_label) const;

  // ---- MPI helpers ------------------------------------------------------------

  MPI_Datatype datatype(const at::Tensor& t) const;

  // kAvg reduces with a sum; finish_average divides afterwards.
  MPI_Op reduction(at::ScalarType type, ReduceOp op) const;

  // Average = sum / size. Integer tensors use floor division (-7 / 2 -> -4),
  // as torch's div(rounding_mode="floor"), so the result stays an integer.
  void finish_average(const at::Tensor& t, ReduceOp op) const;

  // The send buffer of an all-gather whose receive buffer is `recv` (total
  // elements) and whose own slot starts `slot_offset` bytes in: MPI_IN_PLACE
  // when the input already is that slot, nullptr when it overlaps the receive
  // buffer anywhere else (the caller then sends a copy), else the input.
  static const void* gather_send_buffer(const at::Tensor& input, char* recv, int64_t total,
                                        int64_t slot_offset);

  void check(int code, const char* call, const std::string& what) const;
  void check(int code, const char* call, const MpiWork& work) const;

  // ---- queue ----------------------------------------------------------------

  // `message`: the larger of the bytes the operation hands to MPI and the
  // bytes it gets back; it decides whether the operation may run inline.
  WorkPtr enqueue_collective(OpType type, Describe what, std::vector<at::Tensor> keep,
                             uint64_t bytes, uint64_t message,
                             std::function<void(const MpiWork&)> run);

  // Runs a small collective in the caller's thread when nothing of this
  // group is queued or running: a hand-off to the communication thread and
  // back (two wake-ups) costs more than the MPI call itself below some tens
  // of KiB. The group's order is kept: `busy_` makes the communication
  // thread wait for the inline operation before it takes anything queued
  // meanwhile, and an operation that finds the group busy is queued behind.
  // Transfers already posted keep progressing (MPI progresses them inside
  // the collective too). Returns false, doing nothing, when the group is
  // busy.
  bool run_inline(Op& op);

  WorkPtr enqueue_transfer(OpType type, const at::Tensor& tensor, int peer, int tag);

  WorkPtr push(Op op);

  // ---- communication thread -------------------------------------------------

  void run_loop();

  // Runs a collective (or posts a transfer, whose Work completes later in
  // progress_transfers()) and returns its error, if any; finish() then
  // completes the Work.
  std::exception_ptr execute(Op& op);

  // Completes a collective's Work; a posted transfer's completes when MPI
  // says so.
  static void finish(Op& op, std::exception_ptr error);

  void post_transfer(Op& op);

  static void cancel(PendingTransfer& transfer);

  // Tests every pending transfer once; completes those whose chunks are all
  // done. Returns whether any chunk completed.
  bool progress_transfers();

  static std::string chunk_note(const PendingTransfer& transfer, size_t i);

  // Records the first error of a transfer and cancels its other chunks, so a
  // failed multi-chunk recv completes instead of waiting for chunks that the
  // (differently sized) sender will never send.
  static void fail(PendingTransfer& transfer, std::string error);

  // At destruction: cancel what is still pending and give MPI a bounded time
  // to settle it. Receives cancel reliably; a send that MPI cannot cancel and
  // no peer receives is abandoned after kCancelGrace with its buffers kept
  // alive on purpose (MPI may still read them), and reported.
  void cancel_transfers();

  std::string name_;
  std::string world_ranks_;  // "0,2,4" (MPI_COMM_WORLD ranks of the members), for messages
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int tag_ub_ = 32767;
  std::shared_ptr<HalfTypes> half_types_;
  std::shared_ptr<const GroupIdentity> id_;

  CommCounters counters_;

  std::mutex mutex_;  // guards queue_, busy_, stop_ and starting thread_
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool busy_ = false;  // a collective or a posting runs (inline or on the thread)
  bool stop_ = false;
  std::thread thread_;
  std::promise<void> exited_;  // set by the thread as it returns

  std::vector<PendingTransfer> pending_;  // communication thread only
};

}  // namespace kolos::comm::mpi_detail
#pragma GCC visibility pop
