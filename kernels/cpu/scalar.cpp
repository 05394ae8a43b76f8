// The scalar level: plain C++, no target attributes. It defines the results
// the SIMD levels reproduce bit for bit, so it uses std::fma where they use
// a fused multiply-add (on a CPU without FMA, glibc computes it exactly in
// software: slow, but this level is the fallback).
#include <cmath>

#include "kernel_table.h"
#include "scalar_math.h"

namespace kolos::kernels::detail {
namespace {

template <int G>
inline float load_grad(const void* g, int64_t i) {
  if constexpr (G == 0) return static_cast<const float*>(g)[i];
  if constexpr (G == 1) return from_bf16(static_cast<const uint16_t*>(g)[i]);
  if constexpr (G == 2) return from_fp16(static_cast<const uint16_t*>(g)[i]);
}

template <int C>
inline void store_copy(void* c, int64_t i, float x) {
  if constexpr (C == kCopyF32) static_cast<float*>(c)[i] = x;
  if constexpr (C == kCopyBF16) static_cast<uint16_t*>(c)[i] = to_bf16(x);
  if constexpr (C == kCopyF16) static_cast<uint16_t*>(c)[i] = to_fp16(x);
}

template <int G, int C>
void adamw(float* p, const void* g, float* m, float* v, void* copy, int64_t n,
           const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = load_grad<G>(g, i) * s.grad_scale;
    const float pi = p[i] * s.weight_decay_factor;
    const float mi = std::fma(gi, s.one_minus_beta1, m[i] * s.beta1);
    const float vi = std::fma(gi * s.one_minus_beta2, gi, v[i] * s.beta2);
    const float denom = std::sqrt(vi) / s.bias_correction2_sqrt + s.eps;
    const float pn = pi + (s.neg_step_size * mi) / denom;
    p[i] = pn;
    m[i] = mi;
    v[i] = vi;
    store_copy<C>(copy, i, pn);
  }
}

void bf16_to_fp32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_bf16(src[i]);
}
void fp16_to_fp32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_fp16(src[i]);
}
void fp32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}
void fp32_to_fp16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_fp16(src[i]);
}

template <int G>
void sum_squares(const void* x, int64_t n, double lanes[16]) {
  for (int64_t i = 0; i < n; ++i) {
    const double d = load_grad<G>(x, i);
    lanes[i % 16] += d * d;  // the square of a float is exact in double
  }
}

template <int G>
void scale(void* x, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) {
    const float y = load_grad<G>(x, i) * factor;
    if constexpr (G == 0) static_cast<float*>(x)[i] = y;
    if constexpr (G == 1) static_cast<uint16_t*>(x)[i] = to_bf16(y);
    if constexpr (G == 2) static_cast<uint16_t*>(x)[i] = to_fp16(y);
  }
}

// The definition every level matches bit for bit (kernel_table.h).
float gelu_tanh_one(float x) {
  const float cube = x * x * x;
  float t = std::fma(kGeluCubic, cube, x) * kGeluT;
  if (t != t) return t;  // NaN
  t = t < kExpLow ? kExpLow : (t > kExpHigh ? kExpHigh : t);
  const float k = std::nearbyint(t * kLog2e);
  float r = std::fma(-k, kLn2Hi, t);
  r = std::fma(-k, kLn2Lo, r);
  float p = kExpTaylor[0];
  for (int i = 1; i < 8; ++i) p = std::fma(p, r, kExpTaylor[i]);
  const float two_k = float_of(static_cast<uint32_t>(static_cast<int32_t>(k) + 127) << 23);
  return x / (1.0f + p * two_k);
}

void gelu_tanh(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_tanh_one(x[i]);
}

void linear_panel(const float* x, int64_t rows, int64_t in, const float* panel, const float* bias,
                  int64_t cols, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    float acc[kLinearPanel];
    for (int64_t c = 0; c < kLinearPanel; ++c) acc[c] = bias != nullptr && c < cols ? bias[c] : 0.f;
    const float* xr = x + r * in;
    for (int64_t k = 0; k < in; ++k) {
      const float* w = panel + k * kLinearPanel;
      for (int64_t c = 0; c < kLinearPanel; ++c) acc[c] = std::fma(xr[k], w[c], acc[c]);
    }
    for (int64_t c = 0; c < cols; ++c) y[r * ldy + c] = acc[c];
  }
}

}  // namespace

const KernelTable& scalar_table() {
  static const KernelTable table = KOLOS_KERNEL_TABLE();
  return table;
}

}  // namespace kolos::kernels::detail
