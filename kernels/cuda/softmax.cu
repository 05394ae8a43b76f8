// Softmax with a causal mask over the last dimension, fp32, one block per
// row; forward and backward.
#include "check.cuh"
#include "kolos/kernels/cuda.h"

namespace kolos::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Keys [0, visible) of a row are unmasked.
__device__ inline int64_t visible(int64_t row, int64_t cols, int64_t q_len) {
  return row % q_len + (cols - q_len) + 1;
}

__global__ void softmax_causal_forward_kernel(const float* x, float* y, int64_t cols,
                                              int64_t q_len, float scale) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const int64_t n = visible(row, cols, q_len);
  const float* xr = x + row * cols;
  float* yr = y + row * cols;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, xr[j] * scale);
  mx = detail::block_max(mx, shared);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(xr[j] * scale - mx);
  sum = detail::block_sum(sum, shared);
  const float inv = 1.f / sum;
  // Reads of xr for this row are done (block_sum synchronised), so y may be x.
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    yr[j] = j < n ? expf(xr[j] * scale - mx) * inv : 0.f;
}

__global__ void softmax_causal_backward_kernel(const float* y, const float* dy, float* dx,
                                               int64_t cols, int64_t q_len, float scale) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const int64_t n = visible(row, cols, q_len);
  const float* yr = y + row * cols;
  const float* dyr = dy + row * cols;
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += yr[j] * dyr[j];
  dot = detail::block_sum(dot, shared);
  float* dxr = dx + row * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    dxr[j] = j < n ? scale * yr[j] * (dyr[j] - dot) : 0.f;
}

void check_shape(const char* kernel, int64_t rows, int64_t cols, int64_t q_len) {
  detail::check_arg(rows >= 0 && cols > 0 && q_len >= 1 && q_len <= cols, kernel,
                    "needs rows >= 0 and 1 <= q_len <= cols");
}

}  // namespace

void softmax_causal_forward(const float* x, float* y, int64_t rows, int64_t cols, int64_t q_len,
                            float scale, cudaStream_t stream) {
  check_shape("softmax_causal_forward", rows, cols, q_len);
  if (rows == 0) return;
  softmax_causal_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, y, cols, q_len, scale);
  detail::check_launch("softmax_causal_forward");
}

void softmax_causal_backward(const float* y, const float* dy, float* dx, int64_t rows,
                             int64_t cols, int64_t q_len, float scale, cudaStream_t stream) {
  check_shape("softmax_causal_backward", rows, cols, q_len);
  if (rows == 0) return;
  softmax_causal_backward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      y, dy, dx, cols, q_len, scale);
  detail::check_launch("softmax_causal_backward");
}

}  // namespace kolos::kernels::cuda
