// ProcessGroupMPI's collectives (all_reduce to barrier, and split), the
// checks of operation arguments that run in the caller's thread (send and
// recv use them too), and the MPI datatypes, reduction operations and error
// checks of the group's MPI calls.
#include <ATen/ATen.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolos/core/dtype_torch.h"
#include "kolos/core/error.h"
#include "mpi_support.h"
#include "process_group_mpi_detail.h"

namespace kolos::comm::mpi_detail {
namespace {

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

}  // namespace

// ---- collectives ----------------------------------------------------------

WorkPtr ProcessGroupMPI::all_reduce(const at::Tensor& tensor, ReduceOp op) {
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

WorkPtr ProcessGroupMPI::reduce(const at::Tensor& tensor, int root, ReduceOp op) {
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

WorkPtr ProcessGroupMPI::reduce_scatter(const at::Tensor& output,
                                        const std::vector<at::Tensor>& inputs, ReduceOp op) {
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
  KOLOS_CHECK_KIND(kComm, output.numel() == inputs[rank_].numel(), describe(kName), ": output has ",
                   output.numel(), " elements but inputs[", rank_, "] (this rank's share) has ",
                   inputs[rank_].numel(), "; they must match");
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

WorkPtr ProcessGroupMPI::reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                                             ReduceOp op) {
  const char* kName = "reduce_scatter_flat";
  check_tensor(kName, output, "output");
  check_tensor(kName, input, "input");
  check_same_dtype(kName, input, "input", output, "output");
  check_reducible(kName, output, op);
  KOLOS_CHECK_KIND(kComm, input.numel() == size_ * output.numel(), describe(kName), ": input has ",
                   input.numel(), " elements, expected group size ", size_, " x output's ",
                   output.numel(), " = ", size_ * output.numel());
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

WorkPtr ProcessGroupMPI::all_gather(const std::vector<at::Tensor>& outputs,
                                    const at::Tensor& input) {
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
    check(
        MPI_Allgatherv(send, counts[rank_], type, recv, counts.data(), displs.data(), type, comm_),
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

WorkPtr ProcessGroupMPI::all_gather_flat(const at::Tensor& output, const at::Tensor& input) {
  const char* kName = "all_gather_flat";
  check_tensor(kName, output, "output");
  check_tensor(kName, input, "input");
  check_same_dtype(kName, input, "input", output, "output");
  KOLOS_CHECK_KIND(kComm, output.numel() == size_ * input.numel(), describe(kName), ": output has ",
                   output.numel(), " elements, expected group size ", size_, " x input's ",
                   input.numel(), " = ", size_ * input.numel());
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
    check(MPI_Allgather(send, count, type, output.data_ptr(), count, type, comm_), "MPI_Allgather",
          work);
  };
  return enqueue_collective(OpType::kAllGather, std::move(what), {output, input}, bytes,
                            nbytes(output), std::move(run));
}

WorkPtr ProcessGroupMPI::broadcast(const at::Tensor& tensor, int root) {
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

WorkPtr ProcessGroupMPI::all_to_all(const at::Tensor& output, const at::Tensor& input,
                                    const std::vector<int64_t>& out_splits,
                                    const std::vector<int64_t>& in_splits) {
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
  const std::vector<int64_t> sends = splits_or_even(kName, in_splits, input, "in_splits", "input");
  const std::vector<int64_t> recvs =
      splits_or_even(kName, out_splits, output, "out_splits", "output");
  KOLOS_CHECK_KIND(kComm, sends[rank_] == recvs[rank_], describe(kName),
                   ": this rank sends itself ", sends[rank_], " rows (in_splits[", rank_,
                   "]) but expects ", recvs[rank_], " (out_splits[", rank_, "]); they must match");
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

WorkPtr ProcessGroupMPI::barrier() {
  Describe what = [id = id_] { return describe_on(*id, "barrier"); };
  auto run = [this](const MpiWork& work) { check(MPI_Barrier(comm_), "MPI_Barrier", work); };
  return enqueue_collective(OpType::kBarrier, std::move(what), {}, 0, 0, std::move(run));
}

// MPI_Comm_split runs in the group's order like any collective (inline
// when the group is idle, else on its thread), so it never overlaps
// another call on this communicator; the new group then takes its own
// duplicate of the result.
ProcessGroupPtr ProcessGroupMPI::split(int64_t color, int64_t key, const std::string& name) {
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

// ---- validation (caller's thread) -----------------------------------------

std::string ProcessGroupMPI::describe(const std::string& what) const {
  return describe_on(*id_, what);
}

void ProcessGroupMPI::check_tensor(const char* op, const at::Tensor& t, const char* label) const {
  KOLOS_CHECK_KIND(kComm, t.defined(), describe(op), ": ", label, " is an undefined tensor");
  KOLOS_CHECK_KIND(kComm, t.device().is_cpu(), describe(op), ": ", label, " is on device ",
                   t.device(), "; the MPI backend takes CPU tensors only");
  KOLOS_CHECK_KIND(kComm, t.is_contiguous(), describe(op), ": ", label,
                   " is not contiguous (sizes ", t.sizes(), ", strides ", t.strides(),
                   "); pass tensor.contiguous() and copy the result back");
  KOLOS_CHECK_KIND(kComm, find_dtype(t.scalar_type()) != nullptr, describe(op), ": ", label,
                   " has dtype ", dtype_name(t.scalar_type()), "; supported: ", supported_dtypes());
}

void ProcessGroupMPI::check_same_dtype(const char* op, const at::Tensor& a, const char* a_label,
                                       const at::Tensor& b, const char* b_label) const {
  KOLOS_CHECK_KIND(kComm, a.scalar_type() == b.scalar_type(), describe(op), ": ", a_label,
                   " has dtype ", dtype_name(a.scalar_type()), " but ", b_label, " has ",
                   dtype_name(b.scalar_type()), "; they must match");
}

void ProcessGroupMPI::check_reducible(const char* op, const at::Tensor& t, ReduceOp reduce) const {
  KOLOS_CHECK_KIND(kComm, t.scalar_type() != at::kBool, describe(op), ": cannot reduce (",
                   to_string(reduce),
                   ") bool tensors; convert to uint8 (sum/max/min act as count/or/and)");
}

void ProcessGroupMPI::check_list_size(const char* op, const std::vector<at::Tensor>& list,
                                      const char* label) const {
  KOLOS_CHECK_KIND(kComm, static_cast<int>(list.size()) == size_, describe(op), ": ", label,
                   " has ", list.size(), " tensors, expected one per rank (", size_, ")");
}

void ProcessGroupMPI::check_rank(const char* op, int rank, const char* label) const {
  KOLOS_CHECK_KIND(kComm, rank >= 0 && rank < size_, describe(op), ": ", label, " is rank ", rank,
                   ", outside the group's ranks 0..", size_ - 1);
}

void ProcessGroupMPI::check_count(const char* op, int64_t count, const char* label) const {
  KOLOS_CHECK_KIND(kComm, count <= max_count(), describe(op), ": ", label, " has ", count,
                   " elements, more than one MPI call takes (", max_count(),
                   ", MPI counts and displacements are int); split it into several calls");
}

int64_t ProcessGroupMPI::row_numel(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

std::vector<int64_t> ProcessGroupMPI::splits_or_even(const char* op,
                                                     const std::vector<int64_t>& splits,
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

MPI_Datatype ProcessGroupMPI::datatype(const at::Tensor& t) const {
  const at::ScalarType type = t.scalar_type();
  if (type == at::kBFloat16 || type == at::kHalf) return half_types_->type();
  const MPI_Datatype mpi = table_datatype(type);
  if (mpi != MPI_DATATYPE_NULL) return mpi;
  throw CommError(describe(concat("unsupported dtype ", dtype_name(type))));
}

MPI_Op ProcessGroupMPI::reduction(at::ScalarType type, ReduceOp op) const {
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

void ProcessGroupMPI::finish_average(const at::Tensor& t, ReduceOp op) const {
  if (op != ReduceOp::kAvg || size_ == 1 || t.numel() == 0) return;
  if (at::isFloatingType(t.scalar_type())) {
    t.div_(size_);
  } else {
    t.div_(size_, "floor");
  }
}

const void* ProcessGroupMPI::gather_send_buffer(const at::Tensor& input, char* recv, int64_t total,
                                                int64_t slot_offset) {
  if (input.numel() == 0) return input.data_ptr();
  const char* in = bytes_of(input);
  if (in == recv + slot_offset) return MPI_IN_PLACE;
  const int64_t recv_bytes = total * input.element_size();
  if (in < recv + recv_bytes && recv < in + nbytes(input)) return nullptr;
  return in;
}

void ProcessGroupMPI::check(int code, const char* call, const std::string& what) const {
  if (code != MPI_SUCCESS) {
    throw CommError(concat(call, " failed in ", what, ": ", mpi_error_string(code)));
  }
}

void ProcessGroupMPI::check(int code, const char* call, const MpiWork& work) const {
  if (code != MPI_SUCCESS) check(code, call, work.what());
}

}  // namespace kolos::comm::mpi_detail
