// Fused AdamW step over flat buffers (CPU).
//
// One pass per element reads param, grad, exp_avg, exp_avg_sq and writes
// param, exp_avg, exp_avg_sq (28 bytes per fp32 element), instead of
// LibTorch's seven tensor ops (about 100 bytes). The arithmetic is
// LibTorch 1.13's AdamW (torch::optim::AdamW, amsgrad off), in fp32, in its
// order of operations, with the fused multiply-adds its AVX2/AVX-512 kernels
// use:
//   g   = grad * grad_scale                        (exact when grad_scale = 1)
//   p   = p * float(1 - lr * weight_decay)
//   m   = fma(g, float(1 - beta1), m * float(beta1))
//   v   = fma(g * float(1 - beta2), g, v * float(beta2))
//   p   = p + (float(-lr / bc1) * m) / (sqrt(v) / float(sqrt(bc2)) + float(eps))
// with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step computed in double. Every
// ISA level gives the same bits; against LibTorch on a CPU where ATen runs
// its AVX2 or AVX-512 kernels the result is bit-identical too (ATen's
// "default" scalar kernels round m and v without fma: up to 1 ulp per step
// apart). NaN and Inf gradients propagate element-wise as in LibTorch.
//
// Mixed precision: `grad` may be bf16 or fp16, and the updated fp32 (master)
// parameter can be written to a low-precision copy in the same pass
// (`param_copy`, rounded as convert.h says).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kolos/kernels/dtype.h"

namespace kolos::kernels {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;          // the step being taken, 1-based (bias correction)
  double grad_scale = 1.0;   // gradients are multiplied by it first (unscaling, clipping)
};

// One tensor (or shard) to update. param, exp_avg and exp_avg_sq are fp32;
// all buffers hold `numel` elements and must not overlap each other.
struct AdamWBuffer {
  float* param = nullptr;
  const void* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t numel = 0;
  DType grad_dtype = DType::kFloat32;
  void* param_copy = nullptr;  // optional: receives the updated param
  DType copy_dtype = DType::kBFloat16;
};

// Updates every buffer. Work is cut into fixed chunks over all buffers and
// spread over `threads` OpenMP threads (0: omp_get_max_threads()); results do
// not depend on the thread count. Throws std::invalid_argument on a null
// pointer with numel > 0, a negative numel or step < 1.
void adamw_step(const AdamWBuffer* buffers, size_t count, const AdamWConfig& config,
                int threads = 0);

// The common case: one fp32 buffer set.
void adamw_step_fp32(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                     int64_t numel, const AdamWConfig& config, int threads = 0);

// The same update element by element in plain C++ (no dispatch, no threads):
// the reference the SIMD paths are tested against.
void adamw_reference(const AdamWBuffer& buffer, const AdamWConfig& config);

}  // namespace kolos::kernels
