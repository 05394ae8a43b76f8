// Launch error checking for the kernels in kernels/cuda (private).
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace kolos::kernels::cuda::detail {

inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("kolos CUDA kernel ") + kernel +
                             ": launch failed: " + cudaGetErrorString(err));
}

inline void check_arg(bool ok, const char* kernel, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("kolos CUDA kernel ") + kernel + ": " + what);
}

// Sum over a block of blockDim.x (a multiple of 32, <= 1024) threads; every
// thread gets the result. `shared` holds 32 floats.
__device__ inline float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? shared[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ inline float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? shared[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace kolos::kernels::cuda::detail
