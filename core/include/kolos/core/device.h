// The compute device of a run: `[runtime] device = "cpu" | "cuda"`.
//
// kolos itself links only LibTorch's CPU library. Everything that needs
// LibTorch's CUDA side (libtorch_cuda, c10_cuda) or NCCL lives in
// libkolos_cuda.so, which is built when kolos is configured with CUDA
// against a LibTorch that has it (KOLOS_CUDA_BACKEND in kolos/config.h) and
// is loaded on first use, so a CPU run never loads a CUDA library.
// Loading it also loads libtorch_cuda.so, whose initialisers register
// LibTorch's CUDA kernels: from then on at::Tensor::to(kCUDA) and every op
// on CUDA tensors work from code linked against the CPU library only.
//
// On the CUDA device:
// - each rank takes the GPU of its node-local rank (local rank modulo the
//   GPUs of the node); a GPU below compute capability 7.0, a driver or
//   runtime older than CUDA 11, or no GPU at all is refused with the reason;
// - every process group routes by tensor: CUDA tensors go to an NCCL
//   communicator over the group's ranks (created on the group's first CUDA
//   operation, its ncclUniqueId broadcast over the group's MPI
//   communicator), CPU tensors and control stay on MPI.
#pragma once

#include <memory>
#include <string>

#include "kolos/core/comm/process_group.h"

namespace kolos::device {

enum class Kind { kCpu, kCuda };
const char* to_string(Kind kind);

// The interface libkolos_cuda.so implements (its one exported symbol,
// kolos_cuda_backend(), returns it).
class CudaBackend {
 public:
  virtual ~CudaBackend() = default;
  // Makes the GPU of node-local rank `local_rank` current and returns its
  // index. Throws kolos::Error (kind kConfig) naming the host, the GPU and
  // why, when there is no usable GPU.
  virtual int open(int local_rank, const std::string& host) = 0;
  // "NVIDIA H200 (cc 9.0, 139.8 GiB), CUDA runtime 13.2, driver 13.0, NCCL 2.30.7".
  virtual std::string describe(int device) const = 0;
  // An NCCL group over the ranks of `control`, which carries the unique id
  // (collective over `control`).
  virtual comm::ProcessGroupPtr nccl_group(const comm::ProcessGroupPtr& control) = 0;
  // ncclGetUniqueId, as bytes: needs no GPU (bootstrap only).
  virtual std::string nccl_unique_id() const = 0;
  // The NCCL library's version ("2.30.7").
  virtual std::string nccl_version() const = 0;
};

// Whether this kolos was built with libkolos_cuda.so.
bool cuda_backend_built();
// Loads libkolos_cuda.so (from KOLOS_CUDA_LIBRARY when set, else next to
// libkolos_core.so) once per process. Throws kolos::Error (kind kConfig)
// when this kolos has no CUDA backend or the library cannot be loaded,
// with the loader's message.
CudaBackend& cuda_backend();

// Wraps `group` so that operations on CUDA tensors run on an NCCL group
// over the same ranks, made on the first one; CPU tensors stay on `group`.
// split() splits `group` and wraps the result. Needs cuda_backend().
comm::ProcessGroupPtr route_by_device(comm::ProcessGroupPtr group);

}  // namespace kolos::device
