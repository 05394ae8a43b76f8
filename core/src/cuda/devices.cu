// GPU discovery and per-rank device choice (compiled only with CUDA).
//
// Plain CUDA runtime calls, no LibTorch: a rank picks the GPU of its
// node-local rank so that ranks on one node never share a device by
// accident. Without a GPU (or a driver) the count is 0 and nothing is chosen.
#include <cuda_runtime.h>

#include <string>

#include "kolos/core/devices.h"

namespace kolos::cuda {

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device"/"no driver" error
    return 0;
  }
  return count;
}

int select_device(int local_rank) {
  const int count = device_count();
  if (count == 0) return -1;
  const int device = local_rank % count;
  cudaError_t rc = cudaSetDevice(device);
  if (rc != cudaSuccess) {
    throw std::runtime_error("cudaSetDevice(" + std::to_string(device) +
                             ") failed: " + cudaGetErrorString(rc));
  }
  return device;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "unknown";
  return prop.name;
}

}  // namespace kolos::cuda
