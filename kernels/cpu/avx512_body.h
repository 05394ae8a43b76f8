// The AVX-512 kernels, included by avx512.cpp (bf16 conversion in integer
// ops) and avx512_bf16.cpp (vcvtneps2bf16). The includer defines
// KOLOS_AVX512_TARGET (the target attribute string), KOLOS_AVX512_HW_BF16
// (0 or 1) and KOLOS_AVX512_TABLE (the name of the table function of
// kernel_table.h it defines).
//
// Every function here carries the target attribute; nothing from the
// standard library is used, so no out-of-line copy of a shared inline
// function can be compiled with AVX-512 instructions. Tails use masked
// loads and stores, so the whole buffer runs through the same vector code.
#include <immintrin.h>

#include <cstdint>

#include "kernel_table.h"

#define KOLOS_TARGET __attribute__((target(KOLOS_AVX512_TARGET)))

namespace kolos::kernels::detail {
namespace {

KOLOS_TARGET inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

template <int G>
KOLOS_TARGET inline __m512 load16(const void* base, int64_t i, __mmask16 k) {
  if constexpr (G == 0) {
    return _mm512_maskz_loadu_ps(k, static_cast<const float*>(base) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(base) + i);
    if constexpr (G == 1) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    if constexpr (G == 2) return _mm512_cvtph_ps(h);
  }
}

KOLOS_TARGET inline __m256i to_bf16(__m512 x) {
#if KOLOS_AVX512_HW_BF16
  return (__m256i)_mm512_cvtneps_pbh(x);
#else
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rne =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __m512i signed_zero = _mm512_and_si512(hi, _mm512_set1_epi32(0x8000));
  const __mmask16 normal = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7F800000));
  __m512i r = _mm512_mask_mov_epi32(signed_zero, normal, rne);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
#endif
}

KOLOS_TARGET inline __m256i to_fp16(__m512 x) {
  return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// Stores x into a buffer of kind D (0 fp32, 1 bf16, 2 fp16).
template <int D>
KOLOS_TARGET inline void store16(void* base, int64_t i, __mmask16 k, __m512 x) {
  if constexpr (D == 0) _mm512_mask_storeu_ps(static_cast<float*>(base) + i, k, x);
  if constexpr (D == 1) _mm256_mask_storeu_epi16(static_cast<uint16_t*>(base) + i, k, to_bf16(x));
  if constexpr (D == 2) _mm256_mask_storeu_epi16(static_cast<uint16_t*>(base) + i, k, to_fp16(x));
}

template <int G, int C>
KOLOS_TARGET void adamw(float* p, const void* g, float* m, float* v, void* copy, int64_t n,
                        const AdamWScalars& s) {
  const __m512 grad_scale = _mm512_set1_ps(s.grad_scale);
  const __m512 wd = _mm512_set1_ps(s.weight_decay_factor);
  const __m512 b1 = _mm512_set1_ps(s.beta1), a1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(s.beta2), a2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 bc2 = _mm512_set1_ps(s.bias_correction2_sqrt);
  const __m512 eps = _mm512_set1_ps(s.eps);
  const __m512 step = _mm512_set1_ps(s.neg_step_size);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 gi = _mm512_mul_ps(load16<G>(g, i, k), grad_scale);
    const __m512 pi = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + i), wd);
    const __m512 mi = _mm512_fmadd_ps(gi, a1, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, m + i), b1));
    const __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(gi, a2), gi,
                                      _mm512_mul_ps(_mm512_maskz_loadu_ps(k, v + i), b2));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
    const __m512 pn = _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(step, mi), denom));
    _mm512_mask_storeu_ps(p + i, k, pn);
    _mm512_mask_storeu_ps(m + i, k, mi);
    _mm512_mask_storeu_ps(v + i, k, vi);
    if constexpr (C != kNoCopy) store16<C - 1>(copy, i, k, pn);
  }
}

template <int S, int D>
KOLOS_TARGET void convert(const void* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    store16<D>(dst, i, k, load16<S>(src, i, k));
  }
}
KOLOS_TARGET void bf16_to_fp32(const uint16_t* src, float* dst, int64_t n) { convert<1, 0>(src, dst, n); }
KOLOS_TARGET void fp16_to_fp32(const uint16_t* src, float* dst, int64_t n) { convert<2, 0>(src, dst, n); }
KOLOS_TARGET void fp32_to_bf16(const float* src, uint16_t* dst, int64_t n) { convert<0, 1>(src, dst, n); }
KOLOS_TARGET void fp32_to_fp16(const float* src, uint16_t* dst, int64_t n) { convert<0, 2>(src, dst, n); }

// Lanes 0-7 in acc0, 8-15 in acc1; a masked-off tail adds +0 (exact).
template <int G>
KOLOS_TARGET void sum_squares(const void* x, int64_t n, double lanes[16]) {
  __m512d acc0 = _mm512_loadu_pd(lanes), acc1 = _mm512_loadu_pd(lanes + 8);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 xi = load16<G>(x, i, tail_mask(n - i));
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(xi));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(xi), 1)));
    acc0 = _mm512_fmadd_pd(lo, lo, acc0);  // lo*lo is exact: fma == add
    acc1 = _mm512_fmadd_pd(hi, hi, acc1);
  }
  _mm512_storeu_pd(lanes, acc0);
  _mm512_storeu_pd(lanes + 8, acc1);
}

template <int G>
KOLOS_TARGET void scale(void* x, int64_t n, float factor) {
  const __m512 f = _mm512_set1_ps(factor);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    store16<G>(x, i, k, _mm512_mul_ps(load16<G>(x, i, k), f));
  }
}

// GELU's tanh form, the same operations as the scalar definition
// (kernel_table.h); max and min return their second operand, the value,
// when it is a NaN.
KOLOS_TARGET inline __m512 gelu_tanh16(__m512 x) {
  const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  __m512 t =
      _mm512_mul_ps(_mm512_fmadd_ps(_mm512_set1_ps(kGeluCubic), cube, x), _mm512_set1_ps(kGeluT));
  t = _mm512_min_ps(_mm512_set1_ps(kExpHigh), _mm512_max_ps(_mm512_set1_ps(kExpLow), t));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Hi), t);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpTaylor[0]);
#pragma GCC unroll 7
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpTaylor[i]));
  const __m512 two_k = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(p, two_k)));
}

KOLOS_TARGET void gelu_tanh(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, k, gelu_tanh16(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

// Rows [0, MT) of x times one panel: two vectors of 16 outputs per row,
// 2 MT accumulators kept in registers (MT <= 12: 24 of the 32). The first
// tile of a panel (`first`) prefetches the panel's lines ahead of itself,
// in case no earlier tile brought them. When a panel takes several tiles,
// each tile prefetches its share of the next panel's rows (every `shares`-th,
// from row `share`) into the second-level cache, so that memory streams the
// next panel all the while this one is computed, not only during some tiles.
template <int MT>
KOLOS_TARGET inline void linear_tile(const float* x, int64_t in, const float* panel, bool first,
                                     int64_t share, int64_t shares, __m512 b0, __m512 b1,
                                     __mmask16 k0, __mmask16 k1, float* y, int64_t ldy) {
  __m512 acc[MT][2];
#pragma GCC unroll 12
  for (int m = 0; m < MT; ++m) {
    acc[m][0] = b0;
    acc[m][1] = b1;
  }
  int64_t next_k = shares > 1 ? share : in;  // the next row of the next panel to prefetch
  for (int64_t k = 0; k < in; ++k) {
    const float* w = panel + k * kLinearPanel;
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
    if (first) {
      const char* ahead = reinterpret_cast<const char*>(w + kLinearPrefetchRows * kLinearPanel);
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
    }
    if (k == next_k) {
      const char* next = reinterpret_cast<const char*>(w + in * kLinearPanel);
      _mm_prefetch(next, _MM_HINT_T1);
      _mm_prefetch(next + 64, _MM_HINT_T1);
      next_k += shares;
    }
#pragma GCC unroll 12
    for (int m = 0; m < MT; ++m) {
      const __m512 xm = _mm512_set1_ps(x[m * in + k]);
      acc[m][0] = _mm512_fmadd_ps(xm, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(xm, w1, acc[m][1]);
    }
  }
#pragma GCC unroll 12
  for (int m = 0; m < MT; ++m) {
    _mm512_mask_storeu_ps(y + m * ldy, k0, acc[m][0]);
    _mm512_mask_storeu_ps(y + m * ldy + 16, k1, acc[m][1]);
  }
}

using LinearTileFn = void (*)(const float*, int64_t, const float*, bool, int64_t, int64_t, __m512,
                              __m512, __mmask16, __mmask16, float*, int64_t);
constexpr LinearTileFn kTiles[12] = {&linear_tile<1>,  &linear_tile<2>,  &linear_tile<3>,
                                     &linear_tile<4>,  &linear_tile<5>,  &linear_tile<6>,
                                     &linear_tile<7>,  &linear_tile<8>,  &linear_tile<9>,
                                     &linear_tile<10>, &linear_tile<11>, &linear_tile<12>};

KOLOS_TARGET void linear_panel(const float* x, int64_t rows, int64_t in, const float* panel,
                               const float* bias, int64_t cols, float* y, int64_t ldy) {
  const __mmask16 k0 = tail_mask(cols), k1 = tail_mask(cols > 16 ? cols - 16 : 0);
  const __m512 b0 = bias != nullptr ? _mm512_maskz_loadu_ps(k0, bias) : _mm512_setzero_ps();
  const __m512 b1 = bias != nullptr ? _mm512_maskz_loadu_ps(k1, bias + 16) : _mm512_setzero_ps();
  // Tiles of at most 12 rows, as even as possible (16 rows: 8 + 8).
  const int64_t tiles = (rows + 11) / 12;
  for (int64_t t = 0, r = 0; t < tiles; ++t) {
    const int64_t mt = (rows - r) / (tiles - t) + ((rows - r) % (tiles - t) != 0 ? 1 : 0);
    const float* xt = x + r * in;
    float* yt = y + r * ldy;
    kTiles[mt - 1](xt, in, panel, t == 0, t, tiles, b0, b1, k0, k1, yt, ldy);
    r += mt;
  }
}

}  // namespace

const KernelTable& KOLOS_AVX512_TABLE() {
  static const KernelTable table = KOLOS_KERNEL_TABLE();
  return table;
}

}  // namespace kolos::kernels::detail

#undef KOLOS_TARGET
