// ProcessGroupMPI: the MPI backend of ProcessGroup, for CPU tensors.
//
// This file: the group's construction and destruction, its queue, its
// communication thread and point-to-point transfers, and the Work they
// complete. The collectives are in process_group_mpi_collectives.cpp, the
// declarations in process_group_mpi_detail.h, the helpers that need no
// tensors in mpi_support.h.
//
// Thread model. Debian's OpenMPI has no asynchronous progress: a
// non-blocking MPI operation advances only while some thread is inside an MPI
// call. So each group owns one communication thread (started on first use,
// joined by the destructor) and the caller's thread does not wait on MPI,
// except for small collectives (below):
//
//   caller thread                         communication thread
//   -------------                         --------------------
//   validate arguments (throws here)
//   build an Op, push it on the queue ->  pop ops in FIFO order
//   return the Op's Work                  collectives: run the blocking MPI
//                                           call(s), pack/unpack staging
//                                           buffers, divide for kAvg
//                                         send/recv: post MPI_Isend/Irecv in
//                                           queue order, then complete them
//                                           with MPI_Test between ops and
//                                           while idle (with back-off)
//                                         count bytes, then mark Work done
//
// Why point-to-point is posted rather than run as blocking MPI_Send/MPI_Recv:
// with one FIFO thread, a blocking send would keep the recv queued behind it
// from being posted. The common ring (every rank sends to its right, then
// receives from its left) deadlocks as soon as the messages exceed MPI's eager
// limit (4 KiB on the shared-memory path here), because every send waits for
// a recv that its peer has queued but not posted. Posting in queue order keeps
// MPI's non-overtaking order between messages, and a recv whose peer never
// sends does not stall the group's later operations. While a blocking
// collective runs, MPI's progress engine advances the posted transfers too.
//
// Small collectives run inline. A collective of at most
// detail::kDefaultInlineMaxBytes (64 KiB) issued while the group has nothing
// queued or running executes in the caller's thread, and the call returns
// with its Work complete: the hand-off to the thread and back (two wake-ups)
// would cost more than the transfer. A flag (`busy_`) makes the operation
// and the thread exclusive, so nothing overtakes anything: what the caller
// issues while the thread works is queued behind, and the thread takes
// nothing while an inline operation runs. Large collectives (gradient
// buckets) always go to the thread and overlap with computation.
//
// Ordering contract: all ranks must enqueue the collectives of a group in the
// same order (they execute in that order, as MPI requires). Because a small
// collective may block its caller until the group's other ranks issue it, a
// rank must not make the issue of a small collective on one group depend on
// a peer first completing a later operation of another group (as with
// blocking MPI collectives).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kolos/core/comm/mpi.h"
#include "kolos/core/comm/watchdog.h"
#include "kolos/core/dtype_torch.h"
#include "kolos/core/error.h"
#include "mpi_support.h"
#include "process_group_mpi_detail.h"

namespace kolos::comm {
namespace {

// Collectives of at most this many bytes may run in the caller's thread.
std::atomic<int64_t> g_inline_max_bytes{detail::kDefaultInlineMaxBytes};

}  // namespace

namespace mpi_detail {

// ---- Work -------------------------------------------------------------------

void MpiWork::wait(std::chrono::milliseconds timeout) {
  // Already complete (always so for a collective run inline): no lock, no
  // clock. The acquire load pairs with finish()'s release store, so
  // error_, written before it, is visible.
  // Otherwise sleep on the condition variable at once, without spinning
  // first: ranks share cores with their communication threads. Tried with
  // a temporary patch, a caller spinning up to 50 us for the thread's
  // result made 64 KiB all-reduces through the thread 2.3x slower in
  // bench_allreduce (0.36 instead of 0.82 of raw MPI, 2 ranks on 2 cores,
  // load ~3): it took the core the thread needed. The thread does not spin
  // for new work either (a 30 us spin before sleeping cost 15-30% there).
  if (done_.load(std::memory_order_acquire)) {
    if (error_) std::rethrow_exception(error_);
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  const auto ready = [this] { return done_.load(std::memory_order_acquire); };
  // Beyond a year is "forever"; it also keeps now() + timeout from overflowing.
  constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365);
  if (timeout >= kForever) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_for(lock, std::max(timeout, std::chrono::milliseconds(0)), ready)) {
    throw CommError(concat(
        what(), " did not complete within ", timeout.count(),
        " ms and is still pending: a peer may be slow, busy in a different operation (all "
        "ranks must issue a group's collectives in the same order), or dead. If the operation "
        "legitimately takes this long, raise KOLOS_COMM_TIMEOUT_S (seconds, default 600)."));
  }
  if (error_) std::rethrow_exception(error_);
}

void MpiWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::move(error);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

const std::string& MpiWork::what() const {
  std::call_once(what_once_, [this] { what_ = describe_(); });
  return what_;
}

// ---- the group --------------------------------------------------------------

ProcessGroupMPI::ProcessGroupMPI(MPI_Comm parent, std::string name) : name_(std::move(name)) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || mpi_finalized()) {
    throw CommError(concat("cannot create MPI process group '", name_,
                           "': MPI is not initialised (or already finalised); call "
                           "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) first"));
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    throw CommError(concat("cannot create MPI process group '", name_,
                           "': MPI was initialised with thread level ", provided,
                           " but the group's communication thread needs MPI_THREAD_MULTIPLE (",
                           MPI_THREAD_MULTIPLE, "); initialise MPI with MPI_Init_thread"));
  }
  if (parent == MPI_COMM_NULL) {
    throw CommError(concat("cannot create MPI process group '", name_, "' from MPI_COMM_NULL"));
  }
  int rc = MPI_Comm_dup(parent, &comm_);
  if (rc != MPI_SUCCESS) {
    throw CommError(concat("MPI_Comm_dup failed while creating process group '", name_,
                           "': ", mpi_error_string(rc)));
  }
  // From here on the duplicate is ours: free it if the constructor fails.
  try {
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
          "creating the group");
    std::string mpi_name = name_.substr(0, MPI_MAX_OBJECT_NAME - 1);
    MPI_Comm_set_name(comm_, mpi_name.c_str());  // for MPI's own messages; best effort
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", "creating the group");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", "creating the group");
    void* value = nullptr;
    int found = 0;
    check(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &value, &found), "MPI_Comm_get_attr",
          "creating the group");
    tag_ub_ = found ? *static_cast<int*>(value) : 32767;  // 32767: the standard's minimum
    half_types_ = HalfTypes::acquire();
    id_ = std::make_shared<const GroupIdentity>(GroupIdentity{name_, rank_, size_});
    world_ranks_ = describe_world_ranks(comm_, size_);
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

ProcessGroupMPI::~ProcessGroupMPI() {
  try {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
      // A thread inside a blocking collective whose peers never arrive
      // cannot be stopped, and waiting for it would keep this rank from
      // reporting its error and ending the job. Pending transfers get
      // their cancel grace (10 s) first.
      bool in_mpi = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        in_mpi = busy_;
      }
      const auto limit = in_mpi ? std::chrono::seconds(2) : std::chrono::seconds(15);
      if (exited_.get_future().wait_for(limit) == std::future_status::ready) {
        thread_.join();
      } else {
        std::fprintf(stderr,
                     "kolos: process group '%s' destroyed while an operation is still inside "
                     "MPI; its thread and communicator are abandoned\n",
                     name_.c_str());
        thread_.detach();
        comm_ = MPI_COMM_NULL;  // still in use by that thread: not freed
      }
    }
  } catch (...) {
    std::fprintf(stderr, "kolos: error while stopping the thread of process group '%s'\n",
                 name_.c_str());
  }
  if (comm_ != MPI_COMM_NULL) {
    if (mpi_finalized()) {
      std::fprintf(stderr,
                   "kolos: process group '%s' destroyed after MPI_Finalize; its communicator "
                   "could not be freed (destroy groups before finalising MPI)\n",
                   name_.c_str());
    } else {
      MPI_Comm_free(&comm_);
    }
  }
}

// ---- point-to-point -------------------------------------------------------

WorkPtr ProcessGroupMPI::send(const at::Tensor& tensor, int dst, int tag) {
  return enqueue_transfer(OpType::kSend, tensor, dst, tag);
}

WorkPtr ProcessGroupMPI::recv(const at::Tensor& tensor, int src, int tag) {
  return enqueue_transfer(OpType::kRecv, tensor, src, tag);
}

// ---- queue ----------------------------------------------------------------

WorkPtr ProcessGroupMPI::enqueue_collective(OpType type, Describe what,
                                            std::vector<at::Tensor> keep, uint64_t bytes,
                                            uint64_t message,
                                            std::function<void(const MpiWork&)> run) {
  Op op;
  op.work = std::make_shared<MpiWork>(std::move(what), std::move(keep));
  op.type = type;
  op.bytes = bytes;
  op.run = std::move(run);
  const int64_t inline_max = g_inline_max_bytes.load(std::memory_order_relaxed);
  if (inline_max >= 0 && message <= static_cast<uint64_t>(inline_max) && run_inline(op)) {
    return op.work;
  }
  return push(std::move(op));
}

bool ProcessGroupMPI::run_inline(Op& op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (busy_ || !queue_.empty()) return false;
    busy_ = true;
  }
  std::exception_ptr error = execute(op);
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    queued = !queue_.empty();
  }
  if (queued) cv_.notify_one();
  finish(op, std::move(error));
  return true;
}

WorkPtr ProcessGroupMPI::enqueue_transfer(OpType type, const at::Tensor& tensor, int peer,
                                          int tag) {
  const bool is_send = type == OpType::kSend;
  const char* name = is_send ? "send" : "recv";
  check_tensor(name, tensor, "tensor");
  check_rank(name, peer, is_send ? "dst" : "src");
  KOLOS_CHECK_KIND(kComm, tag >= 0 && tag <= tag_ub_, describe(name), ": tag ", tag,
                   " is outside 0..", tag_ub_, " (MPI_TAG_UB)");
  Op op;
  op.work = std::make_shared<MpiWork>(
      [id = id_, name, is_send, peer, tag, numel = tensor.numel(), dtype = tensor.scalar_type()] {
        return describe_on(*id, concat(name, is_send ? " to rank " : " from rank ", peer, " (tag ",
                                       tag, ") of ", numel, " ", dtype_name(dtype), " elements"));
      },
      std::vector<at::Tensor>{tensor});
  op.type = type;
  op.bytes = is_send ? nbytes(tensor) : 0;
  op.tensor = tensor;
  op.peer = peer;
  op.tag = tag;
  return push(std::move(op));
}

WorkPtr ProcessGroupMPI::push(Op op) {
  WorkPtr work = op.work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run_loop(); });
    queue_.push_back(std::move(op));
  }
  cv_.notify_one();
  return work;
}

// ---- communication thread -------------------------------------------------

void ProcessGroupMPI::run_loop() {
  using std::chrono::microseconds;
  constexpr microseconds kMaxBackoff(200);
  microseconds backoff(0);
  // Something to take: queued work, unless an inline operation runs.
  const auto ready = [this] { return !queue_.empty() && !busy_; };
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (ready()) {
      Op op = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      std::exception_ptr error = execute(op);
      // The group is idle again before the caller learns that its
      // operation completed, so that a small collective it issues next
      // (e.g. after waiting for a gradient bucket) finds the group idle
      // and runs inline instead of queueing behind a finished operation.
      lock.lock();
      busy_ = false;
      lock.unlock();
      finish(op, std::move(error));
      progress_transfers();
      backoff = microseconds(0);
      lock.lock();
      continue;
    }
    if (stop_ && queue_.empty()) break;
    if (pending_.empty()) {
      cv_.wait(lock, [&] { return stop_ || ready(); });
      continue;
    }
    // Transfers are pending and nothing is queued: poll them, backing off
    // (yield, then sleep up to kMaxBackoff) while nothing completes; an
    // enqueued op ends the sleep at once.
    lock.unlock();
    const bool progressed = progress_transfers();
    lock.lock();
    if (progressed) {
      backoff = microseconds(0);
      continue;
    }
    backoff = std::min(kMaxBackoff, backoff == microseconds(0) ? microseconds(1) : backoff * 2);
    if (backoff < microseconds(16)) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      cv_.wait_for(lock, backoff, [&] { return stop_ || ready(); });
    }
  }
  lock.unlock();
  cancel_transfers();
  exited_.set_value();
}

std::exception_ptr ProcessGroupMPI::execute(Op& op) {
  if (!op.run) {
    post_transfer(op);
    return nullptr;
  }
  std::exception_ptr error;
  // Plain pointers (16 bytes: std::function stores them without
  // allocating): the watchdog calls this only before watchdog_end below,
  // while op.work and the group are alive.
  const uint64_t watch = watchdog_begin([work = op.work.get(), ranks = &world_ranks_] {
    return work->what() + " (world ranks " + *ranks + ")";
  });
  try {
    op.run(*op.work);
    if (op.counted) counters_.add(op.type, op.bytes);
  } catch (const CommError&) {
    error = std::current_exception();
  } catch (const std::exception& e) {
    error = std::make_exception_ptr(CommError(concat(op.work->what(), " failed: ", e.what())));
  } catch (...) {
    error = std::make_exception_ptr(CommError(concat(op.work->what(), " failed")));
  }
  watchdog_end(watch);
  op.run = nullptr;  // drop its tensor references now; the Work keeps its own
  return error;
}

void ProcessGroupMPI::finish(Op& op, std::exception_ptr error) {
  if (op.type == OpType::kSend || op.type == OpType::kRecv) return;
  op.work->finish(std::move(error));
}

void ProcessGroupMPI::post_transfer(Op& op) {
  PendingTransfer transfer;
  transfer.work = op.work;
  transfer.type = op.type;
  transfer.bytes = op.bytes;
  transfer.datatype = datatype(op.tensor);
  transfer.watch = watchdog_begin([work = op.work, ranks = world_ranks_] {
    return work->what() + " (world ranks " + ranks + ")";
  });
  char* data = bytes_of(op.tensor);
  const int64_t element = op.tensor.element_size();
  for (const auto& [offset, count] : chunks(op.tensor.numel())) {
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = op.type == OpType::kSend
                       ? MPI_Isend(data + offset * element, count, transfer.datatype, op.peer,
                                   op.tag, comm_, &request)
                       : MPI_Irecv(data + offset * element, count, transfer.datatype, op.peer,
                                   op.tag, comm_, &request);
    if (rc != MPI_SUCCESS) {
      transfer.error = concat(op.type == OpType::kSend ? "MPI_Isend" : "MPI_Irecv", " failed in ",
                              op.work->what(), ": ", mpi_error_string(rc));
      cancel(transfer);
      break;
    }
    transfer.requests.push_back(request);
    transfer.expected.push_back(count);
  }
  pending_.push_back(std::move(transfer));
}

void ProcessGroupMPI::cancel(PendingTransfer& transfer) {
  for (MPI_Request& request : transfer.requests) {
    if (request != MPI_REQUEST_NULL) MPI_Cancel(&request);
  }
}

bool ProcessGroupMPI::progress_transfers() {
  bool progressed = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    PendingTransfer& transfer = *it;
    bool done = true;
    for (size_t i = 0; i < transfer.requests.size(); ++i) {
      MPI_Request& request = transfer.requests[i];
      if (request == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status status;
      const int rc = MPI_Test(&request, &flag, &status);
      if (rc != MPI_SUCCESS) {
        // The request completed with an error (e.g. MPI_ERR_TRUNCATE: the
        // message is longer than the tensor); MPI has released it.
        request = MPI_REQUEST_NULL;
        progressed = true;
        fail(transfer, concat(mpi_error_string(rc), chunk_note(transfer, i)));
        continue;
      }
      if (!flag) {
        done = false;
        continue;
      }
      progressed = true;
      int cancelled = 0;
      MPI_Test_cancelled(&status, &cancelled);
      if (cancelled) {
        fail(transfer, "cancelled because the process group was destroyed before it completed");
      } else if (transfer.type == OpType::kRecv) {
        int received = 0;
        MPI_Get_count(&status, transfer.datatype, &received);
        if (received != transfer.expected[i]) {
          fail(transfer, concat("received ", received, " elements but the tensor expects ",
                                transfer.expected[i], chunk_note(transfer, i),
                                "; the sender's tensor has a different size"));
        }
      }
    }
    if (!done) {
      ++it;
      continue;
    }
    watchdog_end(transfer.watch);
    if (transfer.error.empty()) {
      counters_.add(transfer.type, transfer.bytes);
      transfer.work->finish(nullptr);
    } else {
      transfer.work->finish(std::make_exception_ptr(
          CommError(concat(transfer.work->what(), " failed: ", transfer.error))));
    }
    it = pending_.erase(it);
  }
  return progressed;
}

std::string ProcessGroupMPI::chunk_note(const PendingTransfer& transfer, size_t i) {
  if (transfer.requests.size() == 1) return "";
  return concat(" (in chunk ", i + 1, " of ", transfer.requests.size(), ")");
}

void ProcessGroupMPI::fail(PendingTransfer& transfer, std::string error) {
  if (!transfer.error.empty()) return;
  transfer.error = std::move(error);
  cancel(transfer);
}

void ProcessGroupMPI::cancel_transfers() {
  if (pending_.empty()) return;
  if (mpi_finalized()) {
    std::fprintf(stderr,
                 "kolos: process group '%s' destroyed after MPI_Finalize with %zu transfers "
                 "pending\n",
                 name_.c_str(), pending_.size());
    for (auto& transfer : pending_) {
      transfer.work->finish(std::make_exception_ptr(
          CommError(concat(transfer.work->what(), " never completed: MPI was finalised first"))));
    }
    new std::vector<PendingTransfer>(std::move(pending_));  // leaked: buffers must outlive MPI
    return;
  }
  // Chunks that complete despite the cancel succeed; cancelled ones fail the
  // transfer in progress_transfers().
  for (auto& transfer : pending_) cancel(transfer);
  constexpr auto kCancelGrace = std::chrono::seconds(10);
  const auto deadline = std::chrono::steady_clock::now() + kCancelGrace;
  while (!pending_.empty() && std::chrono::steady_clock::now() < deadline) {
    if (!progress_transfers()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (pending_.empty()) return;
  std::fprintf(stderr,
               "kolos: process group '%s' destroyed with %zu transfers that could not be "
               "cancelled (a send no peer receives?); abandoning them\n",
               name_.c_str(), pending_.size());
  for (auto& transfer : pending_) {
    watchdog_end(transfer.watch);
    transfer.work->finish(std::make_exception_ptr(
        CommError(concat(transfer.work->what(),
                         " abandoned: the process group was destroyed while it was pending "
                         "and MPI could not cancel it"))));
  }
  new std::vector<PendingTransfer>(std::move(pending_));  // leaked on purpose, see above
}

}  // namespace mpi_detail

ProcessGroupPtr make_mpi_process_group(MPI_Comm comm, std::string name) {
  return std::make_shared<mpi_detail::ProcessGroupMPI>(comm, std::move(name));
}

namespace detail {
int64_t set_max_mpi_count(int64_t count) {
  return mpi_detail::g_max_count.exchange(std::clamp<int64_t>(count, 1, INT_MAX));
}

int64_t set_inline_max_bytes(int64_t bytes) {
  return g_inline_max_bytes.exchange(std::max<int64_t>(bytes, -1));
}
}  // namespace detail

}  // namespace kolos::comm
