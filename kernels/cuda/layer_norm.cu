// LayerNorm forward and backward over the last dimension, fp32.
// Forward and dx: one block per row. dgamma/dbeta: one thread per column
// summing over rows (coalesced across the block's columns).
#include "check.cuh"
#include "kolos/kernels/cuda.h"

namespace kolos::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void layer_norm_forward_kernel(const float* x, const float* gamma, const float* beta,
                                          float* y, float* mean, float* rstd, int64_t cols,
                                          float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += xr[j];
  const float mu = detail::block_sum(sum, shared) / static_cast<float>(cols);
  float sq = 0.f;  // two passes: no cancellation for large means
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float d = xr[j] - mu;
    sq += d * d;
  }
  const float var = detail::block_sum(sq, shared) / static_cast<float>(cols);
  const float rs = rsqrtf(var + eps);
  float* yr = y + row * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float o = (xr[j] - mu) * rs;
    if (gamma) o *= gamma[j];
    if (beta) o += beta[j];
    yr[j] = o;
  }
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

__global__ void layer_norm_dx_kernel(const float* dy, const float* x, const float* mean,
                                     const float* rstd, const float* gamma, float* dx,
                                     int64_t cols) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float mu = mean[row], rs = rstd[row];
  const float* xr = x + row * cols;
  const float* dyr = dy + row * cols;
  float sum_g = 0.f, sum_gx = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = gamma ? dyr[j] * gamma[j] : dyr[j];
    sum_g += g;
    sum_gx += g * (xr[j] - mu) * rs;
  }
  const float mean_g = detail::block_sum(sum_g, shared) / static_cast<float>(cols);
  const float mean_gx = detail::block_sum(sum_gx, shared) / static_cast<float>(cols);
  float* dxr = dx + row * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = gamma ? dyr[j] * gamma[j] : dyr[j];
    const float xhat = (xr[j] - mu) * rs;
    dxr[j] = rs * (g - mean_g - xhat * mean_gx);
  }
}

__global__ void layer_norm_dparams_kernel(const float* dy, const float* x, const float* mean,
                                          const float* rstd, float* dgamma, float* dbeta,
                                          int64_t rows, int64_t cols) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float dg = 0.f, db = 0.f;
  for (int64_t r = 0; r < rows; ++r) {
    const float d = dy[r * cols + j];
    dg += d * (x[r * cols + j] - mean[r]) * rstd[r];
    db += d;
  }
  if (dgamma) dgamma[j] = dg;
  if (dbeta) dbeta[j] = db;
}

}  // namespace

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream) {
  detail::check_arg(rows >= 0 && cols > 0, "layer_norm_forward", "needs rows >= 0, cols > 0");
  if (rows == 0) return;
  layer_norm_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, gamma, beta, y, mean, rstd, cols, eps);
  detail::check_launch("layer_norm_forward");
}

void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                         const float* gamma, float* dx, float* dgamma, float* dbeta,
                         int64_t rows, int64_t cols, cudaStream_t stream) {
  detail::check_arg(rows >= 0 && cols > 0, "layer_norm_backward", "needs rows >= 0, cols > 0");
  if (rows > 0) {
    layer_norm_dx_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(dy, x, mean, rstd,
                                                                                gamma, dx, cols);
    detail::check_launch("layer_norm_backward (dx)");
  }
  if (dgamma || dbeta) {
    const unsigned blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
    layer_norm_dparams_kernel<<<blocks, kThreads, 0, stream>>>(dy, x, mean, rstd, dgamma, dbeta,
                                                               rows, cols);
    detail::check_launch("layer_norm_backward (dgamma, dbeta)");
  }
}

}  // namespace kolos::kernels::cuda
