// The AVX2 level (AVX2 + FMA + F16C), 8 floats per vector.
//
// Every function carries the target attribute and nothing from the standard
// library is used (see avx512_body.h for why). Tails (n % 8 elements) are
// copied into zero-padded blocks and run through the same vector code.
#include <immintrin.h>

#include <cstdint>

#include "kernel_table.h"

#define KOLOS_TARGET __attribute__((target("avx2,fma,f16c")))

namespace kolos::kernels::detail {
namespace {

template <int G>
KOLOS_TARGET inline __m256 load8(const void* base, int64_t i) {
  if constexpr (G == 0) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (G == 1) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    if constexpr (G == 2) return _mm256_cvtph_ps(h);
  }
}

KOLOS_TARGET inline __m128i to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rne =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i signed_zero = _mm256_and_si256(hi, _mm256_set1_epi32(0x8000));
  const __m256i subnormal = _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7F800000)),
                                               _mm256_setzero_si256());
  __m256i r = _mm256_blendv_epi8(rne, signed_zero, subnormal);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  // Every lane is <= 0xFFFF, so unsigned saturation packs without change.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

template <int D>
KOLOS_TARGET inline void store8(void* base, int64_t i, __m256 x) {
  if constexpr (D == 0) {
    _mm256_storeu_ps(static_cast<float*>(base) + i, x);
  } else {
    __m128i h;
    if constexpr (D == 1) h = to_bf16(x);
    if constexpr (D == 2) h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(base) + i), h);
  }
}

constexpr int64_t elem_size(int kind) { return kind == 0 ? 4 : 2; }

KOLOS_TARGET inline void copy_bytes(void* dst, const void* src, int64_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (int64_t i = 0; i < bytes; ++i) d[i] = s[i];
}

template <int G, int C>
KOLOS_TARGET inline void adamw8(float* p, const void* g, float* m, float* v, void* copy,
                                int64_t i, const AdamWScalars& s) {
  const __m256 gi = _mm256_mul_ps(load8<G>(g, i), _mm256_set1_ps(s.grad_scale));
  const __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), _mm256_set1_ps(s.weight_decay_factor));
  const __m256 mi = _mm256_fmadd_ps(gi, _mm256_set1_ps(s.one_minus_beta1),
                                    _mm256_mul_ps(_mm256_loadu_ps(m + i), _mm256_set1_ps(s.beta1)));
  const __m256 vi =
      _mm256_fmadd_ps(_mm256_mul_ps(gi, _mm256_set1_ps(s.one_minus_beta2)), gi,
                      _mm256_mul_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(s.beta2)));
  const __m256 denom =
      _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), _mm256_set1_ps(s.bias_correction2_sqrt)),
                    _mm256_set1_ps(s.eps));
  const __m256 pn =
      _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(s.neg_step_size), mi), denom));
  _mm256_storeu_ps(p + i, pn);
  _mm256_storeu_ps(m + i, mi);
  _mm256_storeu_ps(v + i, vi);
  if constexpr (C != kNoCopy) store8<C - 1>(copy, i, pn);
}

template <int G, int C>
KOLOS_TARGET void adamw(float* p, const void* g, float* m, float* v, void* copy, int64_t n,
                        const AdamWScalars& s) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) adamw8<G, C>(p, g, m, v, copy, i, s);
  const int64_t rest = n - i;
  if (rest == 0) return;
  alignas(32) float tp[8] = {}, tm[8] = {}, tv[8] = {}, tg[8] = {}, tc[8] = {};
  const int64_t gsize = elem_size(G), csize = C == kNoCopy ? 0 : elem_size(C - 1);
  copy_bytes(tp, p + i, rest * 4);
  copy_bytes(tm, m + i, rest * 4);
  copy_bytes(tv, v + i, rest * 4);
  copy_bytes(tg, static_cast<const unsigned char*>(g) + i * gsize, rest * gsize);
  adamw8<G, C>(tp, tg, tm, tv, tc, 0, s);
  copy_bytes(p + i, tp, rest * 4);
  copy_bytes(m + i, tm, rest * 4);
  copy_bytes(v + i, tv, rest * 4);
  if constexpr (C != kNoCopy) copy_bytes(static_cast<unsigned char*>(copy) + i * csize, tc, rest * csize);
}

template <int S, int D>
KOLOS_TARGET void convert(const void* src, void* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8<D>(dst, i, load8<S>(src, i));
  const int64_t rest = n - i;
  if (rest == 0) return;
  alignas(32) float ts[8] = {}, td[8] = {};
  copy_bytes(ts, static_cast<const unsigned char*>(src) + i * elem_size(S), rest * elem_size(S));
  store8<D>(td, 0, load8<S>(ts, 0));
  copy_bytes(static_cast<unsigned char*>(dst) + i * elem_size(D), td, rest * elem_size(D));
}
KOLOS_TARGET void bf16_to_fp32(const uint16_t* src, float* dst, int64_t n) { convert<1, 0>(src, dst, n); }
KOLOS_TARGET void fp16_to_fp32(const uint16_t* src, float* dst, int64_t n) { convert<2, 0>(src, dst, n); }
KOLOS_TARGET void fp32_to_bf16(const float* src, uint16_t* dst, int64_t n) { convert<0, 1>(src, dst, n); }
KOLOS_TARGET void fp32_to_fp16(const float* src, uint16_t* dst, int64_t n) { convert<0, 2>(src, dst, n); }

// 16 elements per round: lanes 0-3, 4-7, 8-11, 12-15 in acc[0..3]; the
// zero-padded tail adds +0 (exact).
template <int G>
KOLOS_TARGET inline void squares16(const void* x, int64_t i, __m256d acc[4]) {
  const __m256 a = load8<G>(x, i), b = load8<G>(x, i + 8);
  const __m256d d[4] = {_mm256_cvtps_pd(_mm256_castps256_ps128(a)),
                        _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)),
                        _mm256_cvtps_pd(_mm256_castps256_ps128(b)),
                        _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1))};
  for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_pd(d[j], d[j], acc[j]);
}

template <int G>
KOLOS_TARGET void sum_squares(const void* x, int64_t n, double lanes[16]) {
  __m256d acc[4];
  for (int j = 0; j < 4; ++j) acc[j] = _mm256_loadu_pd(lanes + 4 * j);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) squares16<G>(x, i, acc);
  const int64_t rest = n - i;
  if (rest > 0) {
    alignas(32) float t[16] = {};
    copy_bytes(t, static_cast<const unsigned char*>(x) + i * elem_size(G), rest * elem_size(G));
    squares16<G>(t, 0, acc);
  }
  for (int j = 0; j < 4; ++j) _mm256_storeu_pd(lanes + 4 * j, acc[j]);
}

template <int G>
KOLOS_TARGET void scale(void* x, int64_t n, float factor) {
  const __m256 f = _mm256_set1_ps(factor);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8<G>(x, i, _mm256_mul_ps(load8<G>(x, i), f));
  const int64_t rest = n - i;
  if (rest == 0) return;
  alignas(32) float t[8] = {};
  unsigned char* tail = static_cast<unsigned char*>(x) + i * elem_size(G);
  copy_bytes(t, tail, rest * elem_size(G));
  store8<G>(t, 0, _mm256_mul_ps(load8<G>(t, 0), f));
  copy_bytes(tail, t, rest * elem_size(G));
}

// Lanes [0, n) of 8 set (n clamped to [0, 8]).
KOLOS_TARGET inline __m256i lane_mask(int64_t n) {
  const int c = n < 0 ? 0 : (n > 8 ? 8 : static_cast<int>(n));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// GELU's tanh form, the same operations as the scalar definition
// (kernel_table.h); max and min return their second operand, the value,
// when it is a NaN.
KOLOS_TARGET inline __m256 gelu_tanh8(__m256 x) {
  const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  __m256 t =
      _mm256_mul_ps(_mm256_fmadd_ps(_mm256_set1_ps(kGeluCubic), cube, x), _mm256_set1_ps(kGeluT));
  t = _mm256_min_ps(_mm256_set1_ps(kExpHigh), _mm256_max_ps(_mm256_set1_ps(kExpLow), t));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Hi), t);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpTaylor[0]);
#pragma GCC unroll 7
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpTaylor[i]));
  const __m256 two_k = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(p, two_k)));
}

KOLOS_TARGET void gelu_tanh(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu_tanh8(_mm256_loadu_ps(x + i)));
  const int64_t rest = n - i;
  if (rest == 0) return;
  alignas(32) float t[8] = {};
  copy_bytes(t, x + i, rest * 4);
  _mm256_store_ps(t, gelu_tanh8(_mm256_load_ps(t)));
  copy_bytes(y + i, t, rest * 4);
}

// Rows [0, MT) of x times 16 columns of one panel (`half` 0 or 1) over the
// inputs [k0, k1): two vectors of 8 outputs per row, 2 MT accumulators
// (MT <= 6: 12 of the 16 registers), started from the bias at k0 == 0 and
// from y's partial sums after (stored and reloaded exactly, so each output
// is the same fma chain whatever the blocks). Every tile prefetches its
// share of the next panel's rows (every `shares`-th, from row `share`) into
// the second-level cache, so that memory streams all the while this panel
// is computed. The first tile (`first`, only in a block of fewer than
// kLinearFewRows rows) also prefetches both halves' lines ahead of itself
// into the first-level cache.
template <int MT>
KOLOS_TARGET inline void linear_tile(const float* x, int64_t in, int64_t k0, int64_t k1,
                                     const float* panel, int half, bool first, int64_t share,
                                     int64_t shares, __m256 b0, __m256 b1, __m256i m0, __m256i m1,
                                     bool whole, float* y, int64_t ldy) {
  __m256 acc[MT][2];
#pragma GCC unroll 6
  for (int m = 0; m < MT; ++m) {
    if (k0 == 0) {
      acc[m][0] = b0;
      acc[m][1] = b1;
    } else if (whole) {
      acc[m][0] = _mm256_loadu_ps(y + m * ldy);
      acc[m][1] = _mm256_loadu_ps(y + m * ldy + 8);
    } else {
      acc[m][0] = _mm256_maskload_ps(y + m * ldy, m0);
      acc[m][1] = _mm256_maskload_ps(y + m * ldy + 8, m1);
    }
  }
  // The next row of the next panel to prefetch: the first in [k0, k1) of
  // this tile's share.
  int64_t next_k = shares > 1 ? k0 + ((share - k0) % shares + shares) % shares : in;
  for (int64_t k = k0; k < k1; ++k) {
    const float* w = panel + k * kLinearPanel + half * 16;
    const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
    const float* row = panel + k * kLinearPanel;
    if (first) {
      const char* ahead = reinterpret_cast<const char*>(row + kLinearPrefetchRows * kLinearPanel);
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
    }
    if (k == next_k) {
      const char* next = reinterpret_cast<const char*>(row + in * kLinearPanel);
      _mm_prefetch(next, _MM_HINT_T1);
      _mm_prefetch(next + 64, _MM_HINT_T1);
      next_k += shares;
    }
#pragma GCC unroll 6
    for (int m = 0; m < MT; ++m) {
      const __m256 xm = _mm256_broadcast_ss(x + m * in + k);
      acc[m][0] = _mm256_fmadd_ps(xm, w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(xm, w1, acc[m][1]);
    }
  }
  // Masked stores are slow on some CPUs (microcoded on AMD's Zen): only
  // the last panel's last half, narrower than 16 outputs, uses them.
  if (whole) {
#pragma GCC unroll 6
    for (int m = 0; m < MT; ++m) {
      _mm256_storeu_ps(y + m * ldy, acc[m][0]);
      _mm256_storeu_ps(y + m * ldy + 8, acc[m][1]);
    }
    return;
  }
#pragma GCC unroll 6
  for (int m = 0; m < MT; ++m) {
    _mm256_maskstore_ps(y + m * ldy, m0, acc[m][0]);
    _mm256_maskstore_ps(y + m * ldy + 8, m1, acc[m][1]);
  }
}

using LinearTileFn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int, bool,
                              int64_t, int64_t, __m256, __m256, __m256i, __m256i, bool, float*,
                              int64_t);
constexpr LinearTileFn kTiles[6] = {&linear_tile<1>, &linear_tile<2>, &linear_tile<3>,
                                    &linear_tile<4>, &linear_tile<5>, &linear_tile<6>};

KOLOS_TARGET void linear_panel(const float* x, int64_t rows, int64_t in, const float* panel,
                               const float* bias, int64_t cols, float* y, int64_t ldy) {
  // Tiles of at most 6 rows, as even as possible, in each half; the next
  // panel's prefetch is shared among all of them. The inputs go in blocks
  // of kLinearInputBlock, every tile of both halves through one block
  // before the next, so that the block's rows of the panel (both halves:
  // 32 KiB) come from the second-level cache once and stay near for the
  // other tiles.
  const int64_t tiles = (rows + 5) / 6, halves = cols > 16 ? 2 : 1;
  for (int64_t k0 = 0; k0 < in; k0 += kLinearInputBlock) {
    const int64_t k1 = k0 + kLinearInputBlock < in ? k0 + kLinearInputBlock : in;
    for (int half = 0; half < halves; ++half) {
      const int64_t first = half * 16;
      const __m256i m0 = lane_mask(cols - first), m1 = lane_mask(cols - first - 8);
      const __m256 b0 =
          bias != nullptr ? _mm256_maskload_ps(bias + first, m0) : _mm256_setzero_ps();
      const __m256 b1 =
          bias != nullptr ? _mm256_maskload_ps(bias + first + 8, m1) : _mm256_setzero_ps();
      for (int64_t t = 0, r = 0; t < tiles; ++t) {
        const int64_t mt = (rows - r) / (tiles - t) + ((rows - r) % (tiles - t) != 0 ? 1 : 0);
        kTiles[mt - 1](x + r * in, in, k0, k1, panel, half,
                       half == 0 && t == 0 && rows < kLinearFewRows, half * tiles + t,
                       halves * tiles, b0, b1, m0, m1, cols - first >= 16, y + r * ldy + first,
                       ldy);
        r += mt;
      }
    }
  }
}

}  // namespace

const KernelTable& avx2_table() {
  static const KernelTable table = KOLOS_KERNEL_TABLE();
  return table;
}

}  // namespace kolos::kernels::detail
