// ProcessGroupNCCL (process_group_nccl.h).
#include "process_group_nccl.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "kolos/core/comm/counters.h"
#include "kolos/core/comm/watchdog.h"
#include "kolos/core/error.h"

namespace kolos::cuda {
namespace {

using comm::OpType;
using comm::ReduceOp;
using comm::WorkPtr;

uint64_t nbytes(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  throw CommError("unknown reduce op");
}

std::string cuda_text(cudaError_t rc) { return cudaGetErrorString(rc); }

// Every live communicator, so that the watchdog can abort them all before
// it ends the job (a kernel waiting for a stopped peer never returns).
std::mutex g_live_mutex;
std::set<ncclComm_t> g_live;
std::once_flag g_hook_once;

void abort_live_communicators() {
  std::unique_lock<std::mutex> lock(g_live_mutex, std::try_to_lock);
  if (!lock.owns_lock()) return;  // never block the watchdog
  for (ncclComm_t c : g_live) ncclCommAbort(c);
  g_live.clear();
}

// State shared by a group and its Works: a Work may outlive the group.
struct Comm {
  ncclComm_t comm = nullptr;
  std::string name;
  std::atomic<bool> aborted{false};

  void abort() {
    if (aborted.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lock(g_live_mutex);
      g_live.erase(comm);
    }
    ncclCommAbort(comm);
  }
  ~Comm() {
    if (comm == nullptr || aborted.load()) return;
    {
      std::lock_guard<std::mutex> lock(g_live_mutex);
      g_live.erase(comm);
    }
    ncclCommDestroy(comm);
  }
};

class NcclWork final : public comm::Work {
 public:
  NcclWork(std::shared_ptr<Comm> comm, std::string what, std::vector<at::Tensor> tensors,
           cudaEvent_t done, uint64_t token, int device)
      : comm_(std::move(comm)), what_(std::move(what)), tensors_(std::move(tensors)),
        done_(done), token_(token), device_(device) {}
  ~NcclWork() override {
    finish();
    cudaEventDestroy(done_);
  }

  bool is_completed() const override {
    if (finished_.load()) return true;
    return cudaEventQuery(done_) != cudaErrorNotReady;
  }

  void wait(std::chrono::milliseconds timeout) override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    // The caller's stream sees the result in order, as with c10d.
    const cudaStream_t current = c10::cuda::getCurrentCUDAStream(device_).stream();
    cudaError_t rc = cudaStreamWaitEvent(current, done_, 0);
    if (rc != cudaSuccess) fail("cudaStreamWaitEvent: " + cuda_text(rc));
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(10);
    for (;;) {
      rc = cudaEventQuery(done_);
      if (rc == cudaSuccess) break;
      if (rc != cudaErrorNotReady) fail("cudaEventQuery: " + cuda_text(rc));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_->comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        comm_->abort();
        fail(std::string("NCCL reported ") + ncclGetErrorString(async));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        comm_->abort();
        std::ostringstream out;
        out << "timed out after " << timeout.count() / 1000.0 << " s; communicator aborted";
        fail(out.str());
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    finish();
  }

 private:
  void finish() {
    if (finished_.exchange(true)) return;
    comm::watchdog_end(token_);
    tensors_.clear();
  }
  [[noreturn]] void fail(const std::string& why) {
    finish();
    throw CommError(what_ + " on group '" + comm_->name + "' (NCCL) failed: " + why);
  }

  std::shared_ptr<Comm> comm_;
  std::string what_;
  std::vector<at::Tensor> tensors_;
  cudaEvent_t done_;
  uint64_t token_;
  int device_;
  std::atomic<bool> finished_{false};
};

class ProcessGroupNCCL final : public comm::ProcessGroup {
 public:
  ProcessGroupNCCL(comm::ProcessGroupPtr control, int device)
      : control_(std::move(control)), device_(device), name_(control_->name()) {
    std::call_once(g_hook_once, [] { comm::add_watchdog_abort_hook(abort_live_communicators); });
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    // The id: made by rank 0, broadcast over MPI (CPU bytes).
    at::Tensor id = torch::zeros({static_cast<int64_t>(sizeof(ncclUniqueId))}, torch::kUInt8);
    if (control_->rank() == 0) {
      const std::string bytes = nccl_unique_id();
      std::memcpy(id.data_ptr(), bytes.data(), bytes.size());
    }
    control_->broadcast(id, 0)->wait();
    ncclUniqueId unique{};
    std::memcpy(&unique, id.data_ptr(), sizeof unique);
    comm_ = std::make_shared<Comm>();
    comm_->name = name_;
    check(ncclCommInitRank(&comm_->comm, control_->size(), unique, control_->rank()),
          "ncclCommInitRank");
    {
      std::lock_guard<std::mutex> lock(g_live_mutex);
      g_live.insert(comm_->comm);
    }
    stream_ = std::make_unique<c10::cuda::CUDAStream>(
        c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device_)));
  }

  int rank() const override { return control_->rank(); }
  int size() const override { return control_->size(); }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "nccl"; }

  WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    const uint64_t bytes = 2 * static_cast<uint64_t>(size() - 1) * nbytes(tensor) / size();
    return run(OpType::kAllReduce, "all_reduce", {tensor}, bytes, [&](cudaStream_t s) {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           nccl_type(tensor.scalar_type()), nccl_op(op), comm_->comm, s);
    });
  }

  WorkPtr reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                         ReduceOp op) override {
    KOLOS_CHECK_EQ(static_cast<int>(inputs.size()), size(), "reduce_scatter: inputs per rank");
    KOLOS_CHECK_EQ(output.numel(), inputs[rank()].numel(), "reduce_scatter: output size");
    uint64_t total = 0;
    for (const auto& t : inputs) total += nbytes(t);
    std::vector<at::Tensor> all = inputs;
    all.push_back(output);
    return run(OpType::kReduceScatter, "reduce_scatter", all, total - nbytes(output),
               [&](cudaStream_t s) {
                 ncclResult_t rc = ncclGroupStart();
                 for (int r = 0; r < size() && rc == ncclSuccess; ++r) {
                   void* recv = r == rank() ? output.data_ptr() : inputs[r].data_ptr();
                   rc = ncclReduce(inputs[r].data_ptr(), recv, inputs[r].numel(),
                                   nccl_type(inputs[r].scalar_type()), nccl_op(op), r,
                                   comm_->comm, s);
                 }
                 const ncclResult_t end = ncclGroupEnd();
                 return rc != ncclSuccess ? rc : end;
               });
  }

  WorkPtr reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                              ReduceOp op) override {
    KOLOS_CHECK_EQ(input.numel(), output.numel() * size(), "reduce_scatter_flat: input size");
    return run(OpType::kReduceScatter, "reduce_scatter", {output, input},
               nbytes(input) - nbytes(output), [&](cudaStream_t s) {
                 return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                          nccl_type(input.scalar_type()), nccl_op(op),
                                          comm_->comm, s);
               });
  }

  WorkPtr all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input) override {
    KOLOS_CHECK_EQ(static_cast<int>(outputs.size()), size(), "all_gather: outputs per rank");
    KOLOS_CHECK_EQ(outputs[rank()].numel(), input.numel(), "all_gather: own output size");
    std::vector<at::Tensor> all = outputs;
    all.push_back(input);
    return run(OpType::kAllGather, "all_gather", all,
               nbytes(input) * static_cast<uint64_t>(size() - 1), [&](cudaStream_t s) {
                 ncclResult_t rc = ncclGroupStart();
                 for (int r = 0; r < size() && rc == ncclSuccess; ++r) {
                   const void* send = r == rank() ? input.data_ptr() : outputs[r].data_ptr();
                   rc = ncclBroadcast(send, outputs[r].data_ptr(), outputs[r].numel(),
                                      nccl_type(outputs[r].scalar_type()), r, comm_->comm, s);
                 }
                 const ncclResult_t end = ncclGroupEnd();
                 return rc != ncclSuccess ? rc : end;
               });
  }

  WorkPtr all_gather_flat(const at::Tensor& output, const at::Tensor& input) override {
    KOLOS_CHECK_EQ(output.numel(), input.numel() * size(), "all_gather_flat: output size");
    return run(OpType::kAllGather, "all_gather", {output, input},
               nbytes(input) * static_cast<uint64_t>(size() - 1), [&](cudaStream_t s) {
                 return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                                      nccl_type(input.scalar_type()), comm_->comm, s);
               });
  }

  WorkPtr broadcast(const at::Tensor& tensor, int root) override {
    const uint64_t bytes = rank() == root ? nbytes(tensor) * static_cast<uint64_t>(size() - 1) : 0;
    return run(OpType::kBroadcast, "broadcast", {tensor}, bytes, [&](cudaStream_t s) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           nccl_type(tensor.scalar_type()), root, comm_->comm, s);
    });
  }

  WorkPtr all_to_all(const at::Tensor& output, const at::Tensor& input,
                     const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits) override {
    const int n = size();
    auto rows = [n](const at::Tensor& t, const std::vector<int64_t>& splits) {
      if (!splits.empty()) {
        KOLOS_CHECK_EQ(static_cast<int>(splits.size()), n, "all_to_all: splits per rank");
        return splits;
      }
      KOLOS_CHECK(t.dim() > 0 && t.size(0) % n == 0, "all_to_all: ", t.dim() > 0 ? t.size(0) : 0,
                  " rows do not split evenly over ", n, " ranks");
      return std::vector<int64_t>(n, t.size(0) / n);
    };
    const std::vector<int64_t> send_rows = rows(input, in_splits);
    const std::vector<int64_t> recv_rows = rows(output, out_splits);
    const int64_t in_row = input.dim() > 0 && input.size(0) > 0 ? input.numel() / input.size(0) : 0;
    const int64_t out_row =
        output.dim() > 0 && output.size(0) > 0 ? output.numel() / output.size(0) : 0;
    uint64_t bytes = 0;
    for (int r = 0; r < n; ++r) {
      if (r != rank()) bytes += static_cast<uint64_t>(send_rows[r] * in_row) * input.element_size();
    }
    return run(OpType::kAllToAll, "all_to_all", {output, input}, bytes, [&](cudaStream_t s) {
      const ncclDataType_t type = nccl_type(input.scalar_type());
      auto* in = static_cast<char*>(input.data_ptr());
      auto* out = static_cast<char*>(output.data_ptr());
      const int64_t in_row_bytes = in_row * input.element_size();
      const int64_t out_row_bytes = out_row * output.element_size();
      ncclResult_t rc = ncclGroupStart();
      int64_t in_at = 0, out_at = 0;
      for (int r = 0; r < n && rc == ncclSuccess; ++r) {
        if (send_rows[r] > 0) {
          rc = ncclSend(in + in_at * in_row_bytes, send_rows[r] * in_row, type, r, comm_->comm, s);
        }
        if (rc == ncclSuccess && recv_rows[r] > 0) {
          rc = ncclRecv(out + out_at * out_row_bytes, recv_rows[r] * out_row, type, r,
                        comm_->comm, s);
        }
        in_at += send_rows[r];
        out_at += recv_rows[r];
      }
      const ncclResult_t end = ncclGroupEnd();
      return rc != ncclSuccess ? rc : end;
    });
  }

  WorkPtr send(const at::Tensor& tensor, int dst, int /*tag*/) override {
    return run(OpType::kSend, "send to " + std::to_string(dst), {tensor}, nbytes(tensor),
               [&](cudaStream_t s) {
                 return ncclSend(tensor.data_ptr(), tensor.numel(), nccl_type(tensor.scalar_type()),
                                 dst, comm_->comm, s);
               });
  }

  WorkPtr recv(const at::Tensor& tensor, int src, int /*tag*/) override {
    return run(OpType::kRecv, "recv from " + std::to_string(src), {tensor}, 0,
               [&](cudaStream_t s) {
                 return ncclRecv(tensor.data_ptr(), tensor.numel(), nccl_type(tensor.scalar_type()),
                                 src, comm_->comm, s);
               });
  }

  WorkPtr barrier() override {
    at::Tensor one = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat).device(
                                          torch::kCUDA, static_cast<c10::DeviceIndex>(device_)));
    return run(OpType::kBarrier, "barrier", {one}, 0, [&](cudaStream_t s) {
      return ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_->comm, s);
    });
  }

  std::shared_ptr<comm::ProcessGroup> split(int64_t color, int64_t key,
                                            const std::string& name) override {
    auto part = control_->split(color, key, name);
    return part ? make_nccl_group(part, device_) : nullptr;
  }

  comm::CommStats stats() const override { return counters_.snapshot(); }
  void reset_stats() override { counters_.reset(); }

 private:
  void check(ncclResult_t rc, const char* call) const {
    if (rc == ncclSuccess) return;
    const char* last = ncclGetLastError(comm_ ? comm_->comm : nullptr);
    throw CommError(std::string(call) + " on group '" + name_ + "' (NCCL): " +
                    ncclGetErrorString(rc) + (last != nullptr && *last ? std::string(": ") + last : ""));
  }

  // Enqueues `body` on the group's stream after the caller's current
  // stream's work; the Work completes with an event recorded after it.
  WorkPtr run(OpType type, const std::string& op, const std::vector<at::Tensor>& tensors,
              uint64_t bytes, const std::function<ncclResult_t(cudaStream_t)>& body) {
    for (const auto& t : tensors) {
      if (!t.defined()) continue;
      if (!t.is_cuda() || t.get_device() != device_) {
        throw CommError(op + " on group '" + name_ + "' (NCCL): a tensor on " + t.device().str() +
                        ", not on cuda:" + std::to_string(device_));
      }
      if (!t.is_contiguous()) {
        throw CommError(op + " on group '" + name_ + "' (NCCL): tensors must be contiguous");
      }
    }
    if (comm_->aborted.load()) {
      throw CommError(op + " on group '" + name_ + "' (NCCL): the communicator was aborted");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const cudaStream_t stream = stream_->stream();
    const cudaStream_t current = c10::cuda::getCurrentCUDAStream(device_).stream();
    cudaEvent_t ready = nullptr, done = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), op, "cudaEventCreate");
    cuda_check(cudaEventRecord(ready, current), op, "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream, ready, 0), op, "cudaStreamWaitEvent");
    cudaEventDestroy(ready);  // released once the wait is enqueued
    for (const auto& t : tensors) {
      if (t.defined()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *stream_);
    }
    std::string what = op + " of " + std::to_string(bytes_of(tensors)) + " bytes";
    const uint64_t token = comm::watchdog_begin([what, name = name_] {
      return what + " on group '" + name + "' (NCCL)";
    });
    const ncclResult_t rc = body(stream);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      comm::watchdog_end(token);
      check(rc, op.c_str());
    }
    cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), op, "cudaEventCreate");
    cuda_check(cudaEventRecord(done, stream), op, "cudaEventRecord");
    counters_.add(type, bytes);
    return std::make_shared<NcclWork>(comm_, std::move(what), tensors, done, token, device_);
  }

  static uint64_t bytes_of(const std::vector<at::Tensor>& tensors) {
    uint64_t out = 0;
    for (const auto& t : tensors) out += t.defined() ? nbytes(t) : 0;
    return out;
  }

  void cuda_check(cudaError_t rc, const std::string& op, const char* call) const {
    if (rc == cudaSuccess) return;
    throw CommError(op + " on group '" + name_ + "' (NCCL): " + call + ": " + cuda_text(rc));
  }

  comm::ProcessGroupPtr control_;
  int device_;
  std::string name_;
  std::shared_ptr<Comm> comm_;
  std::unique_ptr<c10::cuda::CUDAStream> stream_;
  std::mutex mutex_;
  comm::CommCounters counters_;
};

}  // namespace

ncclDataType_t nccl_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kDouble: return ncclFloat64;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kChar: return ncclInt8;
    case at::kByte:
    case at::kBool: return ncclUint8;
    default: break;
  }
  throw CommError(std::string("NCCL has no data type for ") + c10::toString(type));
}

std::string nccl_unique_id() {
  ncclUniqueId id{};
  const ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    throw CommError(std::string("ncclGetUniqueId: ") + ncclGetErrorString(rc) +
                    (last != nullptr && *last ? std::string(": ") + last : ""));
  }
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

comm::ProcessGroupPtr make_nccl_group(const comm::ProcessGroupPtr& control, int device) {
  KOLOS_CHECK(control != nullptr, "make_nccl_group: no control group");
  return std::make_shared<ProcessGroupNCCL>(control, device);
}

}  // namespace kolos::cuda
