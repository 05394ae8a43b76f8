// CUDA kernels on plain device pointers, with host-side launchers.
//
// Built when CMake finds nvcc (KOLOS_CUDA_ENABLED), whether or not a GPU or
// a CUDA LibTorch is present: this header needs only the CUDA runtime. Every
// launcher enqueues on `stream` and returns without synchronising; a launch
// error (cudaGetLastError) throws std::runtime_error naming the kernel.
// Pointers are device pointers unless said otherwise; all data is fp32,
// row-major and contiguous.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kolos/kernels/adamw.h"

namespace kolos::kernels::cuda {

// One tensor of a multi-tensor AdamW step (device pointers).
struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t numel = 0;
};

// AdamW over `count` tensors (`tensors` is a host array) in as few launches
// as their sizes allow (apex-style multi-tensor apply: up to 32 tensors and
// 320 chunks of 64K elements per launch). Same formula and fp32 rounding as
// the CPU kernel (kolos/kernels/adamw.h; explicit __fmaf_rn & co., no
// contraction), so results are bit-identical to it.
void adamw_step(const AdamWTensor* tensors, size_t count, const AdamWConfig& config,
                cudaStream_t stream = nullptr);

// LayerNorm over the last dimension of x[rows, cols]:
//   y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(var + eps)
// (biased variance, as torch.nn.LayerNorm). gamma/beta may be null (1/0).
// mean and rstd ([rows]) are saved for the backward pass.
void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream = nullptr);
// dx[rows, cols]; dgamma, dbeta ([cols], overwritten) may be null.
void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                         const float* gamma, float* dx, float* dgamma, float* dbeta,
                         int64_t rows, int64_t cols, cudaStream_t stream = nullptr);

// Softmax of scale * x over the last dimension of x[rows, cols] with a
// causal mask: row r is query q = r % q_len and sees keys
// j <= q + (cols - q_len) (the last q_len of cols keys are the queries',
// so q_len = cols is the plain square mask); masked entries get 0.
// Requires 1 <= q_len <= cols. y may equal x.
void softmax_causal_forward(const float* x, float* y, int64_t rows, int64_t cols, int64_t q_len,
                            float scale, cudaStream_t stream = nullptr);
// dx = scale * y * (dy - sum(dy * y)) on the visible entries, 0 elsewhere.
void softmax_causal_backward(const float* y, const float* dy, float* dx, int64_t rows,
                             int64_t cols, int64_t q_len, float scale,
                             cudaStream_t stream = nullptr);

}  // namespace kolos::kernels::cuda
