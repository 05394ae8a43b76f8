// Fused fp32 <-> bf16 / fp16 conversion over flat buffers, multi-threaded.
//
// Rounding, identical on every ISA level (see isa.h):
// - fp32 -> bf16: round to nearest even; NaN stays NaN (quiet bit set, sign
//   and top payload bits kept); fp32 subnormals become zero of the same
//   sign. That last rule is what AVX512_BF16's vcvtneps2bf16 does in
//   hardware (it ignores MXCSR); the other levels do the same in software so
//   that a run's numbers do not depend on the CPU. LibTorch's
//   `to(kBFloat16)` keeps subnormals instead: the two differ only for
//   |x| < 2^-126.
// - fp32 -> fp16: IEEE round to nearest even (subnormals, overflow to inf),
//   NaN quieted as F16C's vcvtps2ph does.
// - bf16 / fp16 -> fp32: exact (fp16 signalling NaNs are quieted).
//
// `threads`: 0 uses omp_get_max_threads(); small buffers run on the calling
// thread. Source and destination must not overlap.
#pragma once

#include <cstdint>

#include "kolos/kernels/dtype.h"

namespace kolos::kernels {

void fp32_to_bf16(const float* src, uint16_t* dst, int64_t n, int threads = 0);
void bf16_to_fp32(const uint16_t* src, float* dst, int64_t n, int threads = 0);
void fp32_to_fp16(const float* src, uint16_t* dst, int64_t n, int threads = 0);
void fp16_to_fp32(const uint16_t* src, float* dst, int64_t n, int threads = 0);
// Any of the above by dtype (same dtype: a copy).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
             int threads = 0);

// One element, as the buffer functions convert it (reference and tests).
uint16_t bf16_from_float(float x);
float float_from_bf16(uint16_t h);
uint16_t fp16_from_float(float x);
float float_from_fp16(uint16_t h);

}  // namespace kolos::kernels
