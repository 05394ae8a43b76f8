// ProcessGroupMPI: the MPI backend of ProcessGroup, for CPU tensors.
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
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "kolos/core/comm/counters.h"
#include "kolos/core/comm/mpi.h"
#include "kolos/core/comm/watchdog.h"
#include "kolos/core/dtype_torch.h"
#include "kolos/core/error.h"

namespace kolos::comm {
namespace {

using ::kolos::detail::concat;

std::atomic<int64_t> g_max_count{INT_MAX};
// Collectives of at most this many bytes may run in the caller's thread.
std::atomic<int64_t> g_inline_max_bytes{detail::kDefaultInlineMaxBytes};

int64_t max_count() { return g_max_count.load(std::memory_order_relaxed); }

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return concat("MPI error ", code);
  return concat(std::string(text, length), " (MPI error ", code, ")");
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// The MPI datatype of each dtype, from the dtype table (kolos/core/dtype.h);
// MPI_DATATYPE_NULL for the 16-bit floats, which travel as HalfTypes::type().
MPI_Datatype table_datatype(at::ScalarType type) {
#define KOLOS_MPI_DATATYPE(name, scalar, size, safetensors, mpi, h5_file, h5_memory) \
  case at::ScalarType::scalar:                                                       \
    return mpi;
  switch (type) {
    KOLOS_DTYPES(KOLOS_MPI_DATATYPE)
    default:
      break;
  }
#undef KOLOS_MPI_DATATYPE
  return MPI_DATATYPE_NULL;
}

std::string supported_dtypes() {
  return dtype_names() + " (bool for broadcast, gathers, all_to_all and send/recv only)";
}

// ---- 16-bit floating point ------------------------------------------------
// MPI has no bfloat16/float16 type. They travel as a 2-byte contiguous type,
// and reductions use user-defined operations that widen each pair to float,
// combine, and round back. Each combination step rounds, so a sum over n ranks
// rounds n-1 times (as NCCL's bf16 ring does), not once.
template <typename T, typename Combine>
void combine_16bit(const void* in, void* inout, const int* length, Combine combine) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) {
    b[i] = T(combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}

struct Plus {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return a > b ? a : b; }
};
struct Min {
  float operator()(float a, float b) const { return a < b ? a : b; }
};

template <typename T, typename Combine>
void mpi_user_op(void* in, void* inout, int* length, MPI_Datatype*) {
  combine_16bit<T>(in, inout, length, Combine{});
}

// The MPI datatype and operations for 16-bit floats, shared by all groups
// alive at a time: created by the first group (under a mutex), freed when the
// last group that uses them is destroyed, which the contract places before
// MPI_Finalize. A later group creates them again.
class HalfTypes {
 public:
  enum Index { kSumIndex = 0, kMaxIndex, kMinIndex, kIndexCount };

  HalfTypes() {
    check(MPI_Type_contiguous(2, MPI_BYTE, &type_), "MPI_Type_contiguous");
    check(MPI_Type_commit(&type_), "MPI_Type_commit");
    check(MPI_Op_create(&mpi_user_op<c10::BFloat16, Plus>, 1, &bf16_[kSumIndex]), "MPI_Op_create");
    check(MPI_Op_create(&mpi_user_op<c10::BFloat16, Max>, 1, &bf16_[kMaxIndex]), "MPI_Op_create");
    check(MPI_Op_create(&mpi_user_op<c10::BFloat16, Min>, 1, &bf16_[kMinIndex]), "MPI_Op_create");
    check(MPI_Op_create(&mpi_user_op<c10::Half, Plus>, 1, &fp16_[kSumIndex]), "MPI_Op_create");
    check(MPI_Op_create(&mpi_user_op<c10::Half, Max>, 1, &fp16_[kMaxIndex]), "MPI_Op_create");
    check(MPI_Op_create(&mpi_user_op<c10::Half, Min>, 1, &fp16_[kMinIndex]), "MPI_Op_create");
  }
  HalfTypes(const HalfTypes&) = delete;
  HalfTypes& operator=(const HalfTypes&) = delete;

  ~HalfTypes() {
    if (mpi_finalized()) return;  // contract broken; nothing can be freed any more
    for (MPI_Op* ops : {bf16_, fp16_}) {
      for (int i = 0; i < kIndexCount; ++i) {
        if (ops[i] != MPI_OP_NULL) MPI_Op_free(&ops[i]);
      }
    }
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }

  MPI_Datatype type() const { return type_; }
  MPI_Op op(at::ScalarType dtype, Index index) const {
    return dtype == at::kBFloat16 ? bf16_[index] : fp16_[index];
  }

  static std::shared_ptr<HalfTypes> acquire() {
    static std::mutex mutex;
    static std::weak_ptr<HalfTypes> current;
    std::lock_guard<std::mutex> lock(mutex);
    std::shared_ptr<HalfTypes> types = current.lock();
    if (!types) {
      types = std::make_shared<HalfTypes>();
      current = types;
    }
    return types;
  }

 private:
  static void check(int code, const char* call) {
    if (code != MPI_SUCCESS) {
      throw CommError(concat(call, " failed while creating the MPI types for 16-bit floats: ",
                             mpi_error_string(code)));
    }
  }

  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_[kIndexCount] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op fp16_[kIndexCount] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

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

  void wait(std::chrono::milliseconds timeout) override {
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

  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::move(error);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

  // "recv from rank 1 (tag 0) on group 'world' (rank 0 of 2)"; thread-safe.
  const std::string& what() const {
    std::call_once(what_once_, [this] { what_ = describe_(); });
    return what_;
  }

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

std::string describe_on(const GroupIdentity& id, const std::string& what) {
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

// The MPI_COMM_WORLD ranks of `comm`'s members in its rank order: "0,2,4";
// long lists are cut ("0,1,2,...,255 (256 ranks)").
std::string describe_world_ranks(MPI_Comm comm, int size) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> local(size), global(size, MPI_UNDEFINED);
  for (int i = 0; i < size; ++i) local[i] = i;
  MPI_Group_translate_ranks(group, size, local.data(), world, global.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  constexpr int kShown = 16;
  std::string out;
  for (int i = 0; i < size && i < kShown; ++i) {
    out += (i ? "," : "") +
           (global[i] == MPI_UNDEFINED ? std::string("?") : std::to_string(global[i]));
  }
  if (size > kShown) out += ",... (" + std::to_string(size) + " ranks)";
  return out;
}

// Pointer arithmetic on contiguous tensors.
char* bytes_of(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }
uint64_t nbytes(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* a0 = bytes_of(a);
  const char* b0 = bytes_of(b);
  return a0 < b0 + nbytes(b) && b0 < a0 + nbytes(a);
}

// Chunks [offset, offset + count) covering `numel` elements; at least one
// (possibly empty) chunk, so that empty point-to-point messages still match.
std::vector<std::pair<int64_t, int>> chunks(int64_t numel) {
  const int64_t limit = max_count();
  std::vector<std::pair<int64_t, int>> out;
  int64_t offset = 0;
  do {
    const int64_t count = std::min(limit, numel - offset);
    out.emplace_back(offset, static_cast<int>(count));
    offset += count;
  } while (offset < numel);
  return out;
}

// True when tensors[r] starts at base + displs[r] elements (all contiguous,
// same element size): the tensors are consecutive views of one buffer and MPI
// can use it directly, without a staging copy.
bool consecutive(const std::vector<at::Tensor>& tensors, const std::vector<int>& displs,
                 const std::vector<int>& counts, char** base) {
  *base = nullptr;
  for (size_t r = 0; r < tensors.size(); ++r) {
    if (counts[r] == 0) continue;
    char* start =
        bytes_of(tensors[r]) - static_cast<int64_t>(displs[r]) * tensors[r].element_size();
    if (*base == nullptr) *base = start;
    if (start != *base) return false;
  }
  return *base != nullptr;
}

// ---- the group --------------------------------------------------------------
class ProcessGroupMPI final : public ProcessGroup {
 public:
  ProcessGroupMPI(MPI_Comm parent, std::string name) : name_(std::move(name)) {
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

  ProcessGroupMPI(const ProcessGroupMPI&) = delete;
  ProcessGroupMPI& operator=(const ProcessGroupMPI&) = delete;

  // Runs the operations already queued (every rank queued them too), cancels
  // transfers still pending, joins the thread and frees the communicator.
  // Never throws.
  ~ProcessGroupMPI() override {
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

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "mpi"; }

  CommStats stats() const override { return counters_.snapshot(); }
  void reset_stats() override { counters_.reset(); }

  // ---- collectives ----------------------------------------------------------

  WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    const char* kName = "all_reduce";
    check_tensor(kName, tensor, "tensor");
    check_reducible(kName, tensor, op);
    const uint64_t bytes = 2 * static_cast<uint64_t>(size_ - 1) * nbytes(tensor) / size_;
    MPI_Datatype type = datatype(tensor);
    MPI_Op mpi_op = reduction(tensor.scalar_type(), op);
    Describe what = [id = id_, kName, op, numel = tensor.numel(), dtype = tensor.scalar_type()] {
      return describe_on(*id, concat(kName, "(", to_string(op), ") of ", numel, " ",
                                     dtype_name(dtype), " elements"));
    };
    auto run = [this, tensor, type, mpi_op, op](const MpiWork& work) {
      char* data = bytes_of(tensor);
      const int64_t element = tensor.element_size();
      for (const auto& [offset, count] : chunks(tensor.numel())) {
        check(MPI_Allreduce(MPI_IN_PLACE, data + offset * element, count, type, mpi_op, comm_),
              "MPI_Allreduce", work);
      }
      finish_average(tensor, op);
    };
    return enqueue_collective(OpType::kAllReduce, std::move(what), {tensor}, bytes, nbytes(tensor),
                              std::move(run));
  }

  WorkPtr reduce(const at::Tensor& tensor, int root, ReduceOp op) override {
    const char* kName = "reduce";
    check_tensor(kName, tensor, "tensor");
    check_rank(kName, root, "root");
    check_reducible(kName, tensor, op);
    const uint64_t bytes = rank_ == root ? 0 : nbytes(tensor);
    MPI_Datatype type = datatype(tensor);
    MPI_Op mpi_op = reduction(tensor.scalar_type(), op);
    Describe what = [id = id_, kName, op, root, numel = tensor.numel(),
                     dtype = tensor.scalar_type()] {
      return describe_on(*id, concat(kName, "(", to_string(op), ") of ", numel, " ",
                                     dtype_name(dtype), " elements onto rank ", root));
    };
    auto run = [this, tensor, root, type, mpi_op, op](const MpiWork& work) {
      char* data = bytes_of(tensor);
      const int64_t element = tensor.element_size();
      const bool at_root = rank_ == root;
      for (const auto& [offset, count] : chunks(tensor.numel())) {
        char* chunk = data + offset * element;
        check(MPI_Reduce(at_root ? MPI_IN_PLACE : chunk, at_root ? chunk : nullptr, count, type,
                         mpi_op, root, comm_),
              "MPI_Reduce", work);
      }
      if (at_root) finish_average(tensor, op);
    };
    return enqueue_collective(OpType::kReduce, std::move(what), {tensor}, bytes, nbytes(tensor),
                              std::move(run));
  }

  WorkPtr reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                         ReduceOp op) override {
    const char* kName = "reduce_scatter";
    check_tensor(kName, output, "output");
    check_reducible(kName, output, op);
    check_list_size(kName, inputs, "inputs");
    std::vector<int> counts(size_);
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      const std::string label = concat("inputs[", r, "]");
      check_tensor(kName, inputs[r], label.c_str());
      check_same_dtype(kName, inputs[r], label.c_str(), output, "output");
      total += inputs[r].numel();
      check_count(kName, total, "inputs (all together)");
      counts[r] = static_cast<int>(inputs[r].numel());
    }
    KOLOS_CHECK_KIND(kComm, output.numel() == inputs[rank_].numel(), describe(kName),
                     ": output has ", output.numel(), " elements but inputs[", rank_,
                     "] (this rank's share) has ", inputs[rank_].numel(), "; they must match");
    const uint64_t bytes =
        static_cast<uint64_t>(total - inputs[rank_].numel()) * output.element_size();
    MPI_Datatype type = datatype(output);
    MPI_Op mpi_op = reduction(output.scalar_type(), op);
    Describe what = [id = id_, kName, op, total, numel = output.numel(),
                     dtype = output.scalar_type()] {
      return describe_on(*id, concat(kName, "(", to_string(op), ") of ", total, " ",
                                     dtype_name(dtype), " elements into ", numel));
    };
    std::vector<at::Tensor> keep = inputs;
    keep.push_back(output);
    auto run = [this, output, inputs, counts, total, type, mpi_op, op](const MpiWork& work) {
      std::vector<int> displs(size_);
      for (int r = 1; r < size_; ++r) displs[r] = displs[r - 1] + counts[r - 1];
      const int64_t element = output.element_size();
      char* send = nullptr;
      at::Tensor packed;
      if (!consecutive(inputs, displs, counts, &send)) {
        packed = at::empty({total}, output.options());
        send = bytes_of(packed);
        for (int r = 0; r < size_; ++r) {
          std::memcpy(send + displs[r] * element, bytes_of(inputs[r]), counts[r] * element);
        }
      }
      const bool aliased = output.numel() > 0 && bytes_of(output) < send + total * element &&
                           send < bytes_of(output) + output.numel() * element;
      at::Tensor result = aliased ? at::empty_like(output) : output;
      check(MPI_Reduce_scatter(send, result.data_ptr(), counts.data(), type, mpi_op, comm_),
            "MPI_Reduce_scatter", work);
      if (aliased) output.copy_(result);
      finish_average(output, op);
    };
    const uint64_t message = static_cast<uint64_t>(total) * output.element_size();
    return enqueue_collective(OpType::kReduceScatter, std::move(what), std::move(keep), bytes,
                              message, std::move(run));
  }

  WorkPtr reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                              ReduceOp op) override {
    const char* kName = "reduce_scatter_flat";
    check_tensor(kName, output, "output");
    check_tensor(kName, input, "input");
    check_same_dtype(kName, input, "input", output, "output");
    check_reducible(kName, output, op);
    KOLOS_CHECK_KIND(kComm, input.numel() == size_ * output.numel(), describe(kName),
                     ": input has ", input.numel(), " elements, expected group size ", size_,
                     " x output's ", output.numel(), " = ", size_ * output.numel());
    check_count(kName, input.numel(), "input");
    const uint64_t bytes = nbytes(input) - nbytes(output);
    MPI_Datatype type = datatype(output);
    MPI_Op mpi_op = reduction(output.scalar_type(), op);
    Describe what = [id = id_, kName, op, numel = input.numel(), dtype = output.scalar_type()] {
      return describe_on(*id, concat(kName, "(", to_string(op), ") of ", numel, " ",
                                     dtype_name(dtype), " elements"));
    };
    auto run = [this, output, input, type, mpi_op, op](const MpiWork& work) {
      const bool aliased = overlaps(output, input);
      at::Tensor result = aliased ? at::empty_like(output) : output;
      check(MPI_Reduce_scatter_block(input.data_ptr(), result.data_ptr(),
                                     static_cast<int>(output.numel()), type, mpi_op, comm_),
            "MPI_Reduce_scatter_block", work);
      if (aliased) output.copy_(result);
      finish_average(output, op);
    };
    return enqueue_collective(OpType::kReduceScatter, std::move(what), {output, input}, bytes,
                              nbytes(input), std::move(run));
  }

  WorkPtr all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input) override {
    const char* kName = "all_gather";
    check_tensor(kName, input, "input");
    check_list_size(kName, outputs, "outputs");
    std::vector<int> counts(size_);
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      const std::string label = concat("outputs[", r, "]");
      check_tensor(kName, outputs[r], label.c_str());
      check_same_dtype(kName, outputs[r], label.c_str(), input, "input");
      total += outputs[r].numel();
      check_count(kName, total, "outputs (all together)");
      counts[r] = static_cast<int>(outputs[r].numel());
    }
    KOLOS_CHECK_KIND(kComm, outputs[rank_].numel() == input.numel(), describe(kName), ": outputs[",
                     rank_, "] (this rank's slot) has ", outputs[rank_].numel(),
                     " elements but input has ", input.numel(), "; they must match");
    const uint64_t bytes = nbytes(input) * static_cast<uint64_t>(size_ - 1);
    MPI_Datatype type = datatype(input);
    Describe what = [id = id_, kName, total, dtype = input.scalar_type()] {
      return describe_on(*id, concat(kName, " of ", total, " ", dtype_name(dtype), " elements"));
    };
    std::vector<at::Tensor> keep = outputs;
    keep.push_back(input);
    auto run = [this, outputs, input, counts, total, type](const MpiWork& work) {
      std::vector<int> displs(size_);
      for (int r = 1; r < size_; ++r) displs[r] = displs[r - 1] + counts[r - 1];
      const int64_t element = input.element_size();
      char* recv = nullptr;
      at::Tensor staging;
      const bool direct = consecutive(outputs, displs, counts, &recv);
      if (!direct) {
        staging = at::empty({total}, input.options());
        recv = bytes_of(staging);
      }
      const void* send = gather_send_buffer(input, recv, total, displs[rank_] * element);
      at::Tensor input_copy;
      if (send == nullptr) {  // input overlaps the receive buffer elsewhere than its slot
        input_copy = input.clone();
        send = input_copy.data_ptr();
      }
      check(MPI_Allgatherv(send, counts[rank_], type, recv, counts.data(), displs.data(), type,
                           comm_),
            "MPI_Allgatherv", work);
      if (!direct) {
        for (int r = 0; r < size_; ++r) {
          std::memcpy(bytes_of(outputs[r]), recv + displs[r] * element, counts[r] * element);
        }
      }
    };
    const uint64_t message = static_cast<uint64_t>(total) * input.element_size();
    return enqueue_collective(OpType::kAllGather, std::move(what), std::move(keep), bytes, message,
                              std::move(run));
  }

  WorkPtr all_gather_flat(const at::Tensor& output, const at::Tensor& input) override {
    const char* kName = "all_gather_flat";
    check_tensor(kName, output, "output");
    check_tensor(kName, input, "input");
    check_same_dtype(kName, input, "input", output, "output");
    KOLOS_CHECK_KIND(kComm, output.numel() == size_ * input.numel(), describe(kName),
                     ": output has ", output.numel(), " elements, expected group size ", size_,
                     " x input's ", input.numel(), " = ", size_ * input.numel());
    check_count(kName, output.numel(), "output");
    const uint64_t bytes = nbytes(input) * static_cast<uint64_t>(size_ - 1);
    MPI_Datatype type = datatype(input);
    Describe what = [id = id_, kName, numel = output.numel(), dtype = input.scalar_type()] {
      return describe_on(*id, concat(kName, " of ", numel, " ", dtype_name(dtype), " elements"));
    };
    auto run = [this, output, input, type](const MpiWork& work) {
      const int count = static_cast<int>(input.numel());
      const void* send = gather_send_buffer(input, bytes_of(output), output.numel(),
                                            static_cast<int64_t>(rank_) * nbytes(input));
      at::Tensor input_copy;
      if (send == nullptr) {
        input_copy = input.clone();
        send = input_copy.data_ptr();
      }
      check(MPI_Allgather(send, count, type, output.data_ptr(), count, type, comm_),
            "MPI_Allgather", work);
    };
    return enqueue_collective(OpType::kAllGather, std::move(what), {output, input}, bytes,
                              nbytes(output), std::move(run));
  }

  WorkPtr broadcast(const at::Tensor& tensor, int root) override {
    const char* kName = "broadcast";
    check_tensor(kName, tensor, "tensor");
    check_rank(kName, root, "root");
    const uint64_t bytes = rank_ == root ? nbytes(tensor) * static_cast<uint64_t>(size_ - 1) : 0;
    MPI_Datatype type = datatype(tensor);
    Describe what = [id = id_, kName, root, numel = tensor.numel(), dtype = tensor.scalar_type()] {
      return describe_on(
          *id, concat(kName, " of ", numel, " ", dtype_name(dtype), " elements from rank ", root));
    };
    auto run = [this, tensor, root, type](const MpiWork& work) {
      char* data = bytes_of(tensor);
      const int64_t element = tensor.element_size();
      for (const auto& [offset, count] : chunks(tensor.numel())) {
        check(MPI_Bcast(data + offset * element, count, type, root, comm_), "MPI_Bcast", work);
      }
    };
    return enqueue_collective(OpType::kBroadcast, std::move(what), {tensor}, bytes, nbytes(tensor),
                              std::move(run));
  }

  WorkPtr all_to_all(const at::Tensor& output, const at::Tensor& input,
                     const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits) override {
    const char* kName = "all_to_all";
    check_tensor(kName, output, "output");
    check_tensor(kName, input, "input");
    check_same_dtype(kName, input, "input", output, "output");
    KOLOS_CHECK_KIND(kComm, input.dim() >= 1 && output.dim() >= 1, describe(kName), ": input (",
                     input.dim(), " dims) and output (", output.dim(),
                     " dims) must have at least one dimension to split rows along");
    const int64_t row = row_numel(input);
    KOLOS_CHECK_KIND(kComm, row == row_numel(output), describe(kName), ": a row of input has ", row,
                     " elements (sizes ", input.sizes(), ") but a row of output has ",
                     row_numel(output), " (sizes ", output.sizes(),
                     "); they must match (row = numel / size(0))");
    const std::vector<int64_t> sends =
        splits_or_even(kName, in_splits, input, "in_splits", "input");
    const std::vector<int64_t> recvs =
        splits_or_even(kName, out_splits, output, "out_splits", "output");
    KOLOS_CHECK_KIND(kComm, sends[rank_] == recvs[rank_], describe(kName),
                     ": this rank sends itself ", sends[rank_], " rows (in_splits[", rank_,
                     "]) but expects ", recvs[rank_], " (out_splits[", rank_,
                     "]); they must match");
    check_count(kName, input.numel(), "input");
    check_count(kName, output.numel(), "output");
    std::vector<int> send_counts(size_), send_displs(size_), recv_counts(size_), recv_displs(size_);
    uint64_t bytes = 0;
    for (int r = 0; r < size_; ++r) {
      send_counts[r] = static_cast<int>(sends[r] * row);
      recv_counts[r] = static_cast<int>(recvs[r] * row);
      if (r > 0) {
        send_displs[r] = send_displs[r - 1] + send_counts[r - 1];
        recv_displs[r] = recv_displs[r - 1] + recv_counts[r - 1];
      }
      if (r != rank_) bytes += static_cast<uint64_t>(send_counts[r]) * input.element_size();
    }
    MPI_Datatype type = datatype(input);
    Describe what = [id = id_, kName, numel = input.numel(), dtype = input.scalar_type()] {
      return describe_on(*id, concat(kName, " of ", numel, " ", dtype_name(dtype), " elements"));
    };
    auto run = [this, output, input, send_counts, send_displs, recv_counts, recv_displs,
                type](const MpiWork& work) {
      const bool aliased = overlaps(output, input);
      at::Tensor result = aliased ? at::empty_like(output) : output;
      check(MPI_Alltoallv(input.data_ptr(), send_counts.data(), send_displs.data(), type,
                          result.data_ptr(), recv_counts.data(), recv_displs.data(), type, comm_),
            "MPI_Alltoallv", work);
      if (aliased) output.copy_(result);
    };
    return enqueue_collective(OpType::kAllToAll, std::move(what), {output, input}, bytes,
                              std::max(nbytes(input), nbytes(output)), std::move(run));
  }

  WorkPtr barrier() override {
    Describe what = [id = id_] { return describe_on(*id, "barrier"); };
    auto run = [this](const MpiWork& work) { check(MPI_Barrier(comm_), "MPI_Barrier", work); };
    return enqueue_collective(OpType::kBarrier, std::move(what), {}, 0, 0, std::move(run));
  }

  // MPI_Comm_split runs in the group's order like any collective (inline
  // when the group is idle, else on its thread), so it never overlaps
  // another call on this communicator; the new group then takes its own
  // duplicate of the result.
  ProcessGroupPtr split(int64_t color, int64_t key, const std::string& name) override {
    KOLOS_CHECK_KIND(kComm, color <= INT_MAX && key >= INT_MIN && key <= INT_MAX, describe("split"),
                     ": color ", color, " or key ", key, " does not fit MPI's int");
    auto result = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    Op op;
    op.work = std::make_shared<MpiWork>(
        [id = id_, name] { return describe_on(*id, concat("split into '", name, "'")); },
        std::vector<at::Tensor>{});
    op.type = OpType::kBarrier;
    op.counted = false;
    op.run = [this, result, color, key](const MpiWork& work) {
      check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : static_cast<int>(color),
                           static_cast<int>(key), result.get()),
            "MPI_Comm_split", work);
    };
    WorkPtr work = op.work;
    if (!run_inline(op)) work = push(std::move(op));
    work->wait();
    if (*result == MPI_COMM_NULL) return nullptr;
    try {
      auto group = std::make_shared<ProcessGroupMPI>(*result, name);
      MPI_Comm_free(result.get());
      return group;
    } catch (...) {
      MPI_Comm_free(result.get());
      throw;
    }
  }

  // ---- point-to-point -------------------------------------------------------

  WorkPtr send(const at::Tensor& tensor, int dst, int tag) override {
    return enqueue_transfer(OpType::kSend, tensor, dst, tag);
  }

  WorkPtr recv(const at::Tensor& tensor, int src, int tag) override {
    return enqueue_transfer(OpType::kRecv, tensor, src, tag);
  }

 private:
  // ---- validation (caller's thread) -----------------------------------------

  std::string describe(const std::string& what) const { return describe_on(*id_, what); }

  void check_tensor(const char* op, const at::Tensor& t, const char* label) const {
    KOLOS_CHECK_KIND(kComm, t.defined(), describe(op), ": ", label, " is an undefined tensor");
    KOLOS_CHECK_KIND(kComm, t.device().is_cpu(), describe(op), ": ", label, " is on device ",
                     t.device(), "; the MPI backend takes CPU tensors only");
    KOLOS_CHECK_KIND(kComm, t.is_contiguous(), describe(op), ": ", label,
                     " is not contiguous (sizes ", t.sizes(), ", strides ", t.strides(),
                     "); pass tensor.contiguous() and copy the result back");
    KOLOS_CHECK_KIND(kComm, find_dtype(t.scalar_type()) != nullptr, describe(op), ": ", label,
                     " has dtype ", dtype_name(t.scalar_type()),
                     "; supported: ", supported_dtypes());
  }

  void check_same_dtype(const char* op, const at::Tensor& a, const char* a_label,
                        const at::Tensor& b, const char* b_label) const {
    KOLOS_CHECK_KIND(kComm, a.scalar_type() == b.scalar_type(), describe(op), ": ", a_label,
                     " has dtype ", dtype_name(a.scalar_type()), " but ", b_label, " has ",
                     dtype_name(b.scalar_type()), "; they must match");
  }

  void check_reducible(const char* op, const at::Tensor& t, ReduceOp reduce) const {
    KOLOS_CHECK_KIND(kComm, t.scalar_type() != at::kBool, describe(op), ": cannot reduce (",
                     to_string(reduce),
                     ") bool tensors; convert to uint8 (sum/max/min act as count/or/and)");
  }

  void check_list_size(const char* op, const std::vector<at::Tensor>& list,
                       const char* label) const {
    KOLOS_CHECK_KIND(kComm, static_cast<int>(list.size()) == size_, describe(op), ": ", label,
                     " has ", list.size(), " tensors, expected one per rank (", size_, ")");
  }

  void check_rank(const char* op, int rank, const char* label) const {
    KOLOS_CHECK_KIND(kComm, rank >= 0 && rank < size_, describe(op), ": ", label, " is rank ", rank,
                     ", outside the group's ranks 0..", size_ - 1);
  }

  void check_count(const char* op, int64_t count, const char* label) const {
    KOLOS_CHECK_KIND(kComm, count <= max_count(), describe(op), ": ", label, " has ", count,
                     " elements, more than one MPI call takes (", max_count(),
                     ", MPI counts and displacements are int); split it into several calls");
  }

  static int64_t row_numel(const at::Tensor& t) {
    int64_t n = 1;
    for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
    return n;
  }

  std::vector<int64_t> splits_or_even(const char* op, const std::vector<int64_t>& splits,
                                      const at::Tensor& t, const char* label,
                                      const char* tensor_label) const {
    const int64_t rows = t.size(0);
    if (splits.empty()) {
      KOLOS_CHECK_KIND(kComm, rows % size_ == 0, describe(op), ": ", label,
                       " is empty (even split) but ", tensor_label, " has ", rows,
                       " rows, not a multiple of the group size ", size_);
      return std::vector<int64_t>(size_, rows / size_);
    }
    KOLOS_CHECK_KIND(kComm, static_cast<int>(splits.size()) == size_, describe(op), ": ", label,
                     " has ", splits.size(), " entries, expected one per rank (", size_,
                     ") or none for an even split");
    int64_t sum = 0;
    for (int r = 0; r < size_; ++r) {
      KOLOS_CHECK_KIND(kComm, splits[r] >= 0, describe(op), ": ", label, "[", r, "] is ", splits[r],
                       "; row counts must be >= 0");
      sum += splits[r];
    }
    KOLOS_CHECK_KIND(kComm, sum == rows, describe(op), ": ", label, " sums to ", sum, " rows but ",
                     tensor_label, " has ", rows, " rows (size(0)); they must match");
    return splits;
  }

  // ---- MPI helpers ------------------------------------------------------------

  MPI_Datatype datatype(const at::Tensor& t) const {
    const at::ScalarType type = t.scalar_type();
    if (type == at::kBFloat16 || type == at::kHalf) return half_types_->type();
    const MPI_Datatype mpi = table_datatype(type);
    if (mpi != MPI_DATATYPE_NULL) return mpi;
    throw CommError(describe(concat("unsupported dtype ", dtype_name(type))));
  }

  // kAvg reduces with a sum; finish_average divides afterwards.
  MPI_Op reduction(at::ScalarType type, ReduceOp op) const {
    const bool half = type == at::kBFloat16 || type == at::kHalf;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return half ? half_types_->op(type, HalfTypes::kSumIndex) : MPI_SUM;
      case ReduceOp::kMax:
        return half ? half_types_->op(type, HalfTypes::kMaxIndex) : MPI_MAX;
      case ReduceOp::kMin:
        return half ? half_types_->op(type, HalfTypes::kMinIndex) : MPI_MIN;
    }
    throw CommError(describe("unknown reduce op"));
  }

  // Average = sum / size. Integer tensors use floor division (-7 / 2 -> -4),
  // as torch's div(rounding_mode="floor"), so the result stays an integer.
  void finish_average(const at::Tensor& t, ReduceOp op) const {
    if (op != ReduceOp::kAvg || size_ == 1 || t.numel() == 0) return;
    if (at::isFloatingType(t.scalar_type())) {
      t.div_(size_);
    } else {
      t.div_(size_, "floor");
    }
  }

  // The send buffer of an all-gather whose receive buffer is `recv` (total
  // elements) and whose own slot starts `slot_offset` bytes in: MPI_IN_PLACE
  // when the input already is that slot, nullptr when it overlaps the receive
  // buffer anywhere else (the caller then sends a copy), else the input.
  static const void* gather_send_buffer(const at::Tensor& input, char* recv, int64_t total,
                                        int64_t slot_offset) {
    if (input.numel() == 0) return input.data_ptr();
    const char* in = bytes_of(input);
    if (in == recv + slot_offset) return MPI_IN_PLACE;
    const int64_t recv_bytes = total * input.element_size();
    if (in < recv + recv_bytes && recv < in + nbytes(input)) return nullptr;
    return in;
  }

  void check(int code, const char* call, const std::string& what) const {
    if (code != MPI_SUCCESS) {
      throw CommError(concat(call, " failed in ", what, ": ", mpi_error_string(code)));
    }
  }
  void check(int code, const char* call, const MpiWork& work) const {
    if (code != MPI_SUCCESS) check(code, call, work.what());
  }

  // ---- queue ----------------------------------------------------------------

  // `message`: the larger of the bytes the operation hands to MPI and the
  // bytes it gets back; it decides whether the operation may run inline.
  WorkPtr enqueue_collective(OpType type, Describe what, std::vector<at::Tensor> keep,
                             uint64_t bytes, uint64_t message,
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

  // Runs a small collective in the caller's thread when nothing of this
  // group is queued or running: a hand-off to the communication thread and
  // back (two wake-ups) costs more than the MPI call itself below some tens
  // of KiB. The group's order is kept: `busy_` makes the communication
  // thread wait for the inline operation before it takes anything queued
  // meanwhile, and an operation that finds the group busy is queued behind.
  // Transfers already posted keep progressing (MPI progresses them inside
  // the collective too). Returns false, doing nothing, when the group is
  // busy.
  bool run_inline(Op& op) {
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

  WorkPtr enqueue_transfer(OpType type, const at::Tensor& tensor, int peer, int tag) {
    const bool is_send = type == OpType::kSend;
    const char* name = is_send ? "send" : "recv";
    check_tensor(name, tensor, "tensor");
    check_rank(name, peer, is_send ? "dst" : "src");
    KOLOS_CHECK_KIND(kComm, tag >= 0 && tag <= tag_ub_, describe(name), ": tag ", tag,
                     " is outside 0..", tag_ub_, " (MPI_TAG_UB)");
    Op op;
    op.work = std::make_shared<MpiWork>(
        [id = id_, name, is_send, peer, tag, numel = tensor.numel(), dtype = tensor.scalar_type()] {
          return describe_on(
              *id, concat(name, is_send ? " to rank " : " from rank ", peer, " (tag ", tag, ") of ",
                          numel, " ", dtype_name(dtype), " elements"));
        },
        std::vector<at::Tensor>{tensor});
    op.type = type;
    op.bytes = is_send ? nbytes(tensor) : 0;
    op.tensor = tensor;
    op.peer = peer;
    op.tag = tag;
    return push(std::move(op));
  }

  WorkPtr push(Op op) {
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

  void run_loop() {
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

  // Runs a collective (or posts a transfer, whose Work completes later in
  // progress_transfers()) and returns its error, if any; finish() then
  // completes the Work.
  std::exception_ptr execute(Op& op) {
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

  // Completes a collective's Work; a posted transfer's completes when MPI
  // says so.
  static void finish(Op& op, std::exception_ptr error) {
    if (op.type == OpType::kSend || op.type == OpType::kRecv) return;
    op.work->finish(std::move(error));
  }

  void post_transfer(Op& op) {
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

  static void cancel(PendingTransfer& transfer) {
    for (MPI_Request& request : transfer.requests) {
      if (request != MPI_REQUEST_NULL) MPI_Cancel(&request);
    }
  }

  // Tests every pending transfer once; completes those whose chunks are all
  // done. Returns whether any chunk completed.
  bool progress_transfers() {
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

  static std::string chunk_note(const PendingTransfer& transfer, size_t i) {
    if (transfer.requests.size() == 1) return "";
    return concat(" (in chunk ", i + 1, " of ", transfer.requests.size(), ")");
  }

  // Records the first error of a transfer and cancels its other chunks, so a
  // failed multi-chunk recv completes instead of waiting for chunks that the
  // (differently sized) sender will never send.
  static void fail(PendingTransfer& transfer, std::string error) {
    if (!transfer.error.empty()) return;
    transfer.error = std::move(error);
    cancel(transfer);
  }

  // At destruction: cancel what is still pending and give MPI a bounded time
  // to settle it. Receives cancel reliably; a send that MPI cannot cancel and
  // no peer receives is abandoned after kCancelGrace with its buffers kept
  // alive on purpose (MPI may still read them), and reported.
  void cancel_transfers() {
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

}  // namespace

ProcessGroupPtr make_mpi_process_group(MPI_Comm comm, std::string name) {
  return std::make_shared<ProcessGroupMPI>(comm, std::move(name));
}

namespace detail {
int64_t set_max_mpi_count(int64_t count) {
  return g_max_count.exchange(std::clamp<int64_t>(count, 1, INT_MAX));
}

int64_t set_inline_max_bytes(int64_t bytes) {
  return g_inline_max_bytes.exchange(std::max<int64_t>(bytes, -1));
}
}  // namespace detail

}  // namespace kolos::comm
