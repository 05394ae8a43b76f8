#include "kolos/inference/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KOLOS_PAGED_AVX2 1
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

namespace kolos::inference {
namespace {

// A bf16 value is the high half of an fp32.
struct Bf16 {
  uint16_t bits;
};
inline float widen(float x) { return x; }
inline float widen(Bf16 x) {
  const uint32_t wide = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

struct Portable {
  template <typename T>
  static float dot(const float* a, const T* b, int64_t n) {
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += a[i] * widen(b[i]);
    return sum;
  }
  template <typename T>
  static void add_scaled(float* out, float weight, const T* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] += weight * widen(x[i]);
  }
  // s[0, n) = softmax(s[0, n)).
  static void softmax(float* s, int64_t n) {
    const float top = *std::max_element(s, s + n);
    float total = 0;
    for (int64_t p = 0; p < n; ++p) total += (s[p] = std::exp(s[p] - top));
    for (int64_t p = 0; p < n; ++p) s[p] /= total;
  }
};

#ifdef KOLOS_PAGED_AVX2
// n a multiple of 8.
struct Avx2 {
  __attribute__((target("avx2,fma"))) static __m256 load(const float* p) {
    return _mm256_loadu_ps(p);
  }
  __attribute__((target("avx2,fma"))) static __m256 load(const Bf16* p) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
  }
  template <typename T>
  __attribute__((target("avx2,fma"))) static float dot(const float* a, const T* b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load(b + i), acc);
    }
    const __m128 pair = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 two = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
  }
  template <typename T>
  __attribute__((target("avx2,fma"))) static void add_scaled(float* out, float weight, const T* x,
                                                             int64_t n) {
    const __m256 w = _mm256_set1_ps(weight);
    for (int64_t i = 0; i < n; i += 8) {
      _mm256_storeu_ps(out + i, _mm256_fmadd_ps(w, load(x + i), _mm256_loadu_ps(out + i)));
    }
  }
  // exp(x) for x <= 0 (a score less the row's largest): x = k ln 2 + r
  // with |r| <= ln 2 / 2 (ln 2 in two parts, so that r is nearly exact),
  // e^r by its degree-7 Taylor polynomial in Horner form (truncation under
  // 4e-9 relative), times 2^k built in the exponent bits; 0 below -87
  // (where 2^k leaves the normal range; e^-87 is 1.6e-38). A NaN stays a
  // NaN (max and the mask keep it), so that a diverged score shows.
  __attribute__((target("avx2,fma"))) static __m256 exp_nonpositive(__m256 x) {
    const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);  // x where either is a NaN
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.0f / 5040);
    for (const float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) {
      y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    const __m256i two_k =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(below, _mm256_mul_ps(y, _mm256_castsi256_ps(two_k)));
  }
  __attribute__((target("avx2,fma"))) static void softmax(float* s, int64_t n) {
    const int64_t whole = n / 8 * 8;
    float top = -INFINITY;
    for (int64_t p = whole; p < n; ++p) top = std::max(top, s[p]);
    if (whole > 0) {
      __m256 m = _mm256_loadu_ps(s);
      for (int64_t p = 8; p < whole; p += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + p));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, m);
      for (const float v : lanes) top = std::max(top, v);
    }
    const __m256 shift = _mm256_set1_ps(top);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t p = 0; p < whole; p += 8) {
      const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + p), shift));
      _mm256_storeu_ps(s + p, e);
      sum = _mm256_add_ps(sum, e);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, sum);
    float total = 0;
    for (const float v : lanes) total += v;
    if (whole < n) {
      // The tail through the same vector exp, so that every score is
      // computed alike.
      alignas(32) float tail[8];
      for (int64_t i = 0; i < 8; ++i) tail[i] = whole + i < n ? s[whole + i] - top : -100.0f;
      _mm256_store_ps(tail, exp_nonpositive(_mm256_load_ps(tail)));
      for (int64_t p = whole; p < n; ++p) total += (s[p] = tail[p - whole]);
    }
    const float inv_total = 1.0f / total;
    const __m256 inv = _mm256_set1_ps(inv_total);
    for (int64_t p = 0; p < whole; p += 8) {
      _mm256_storeu_ps(s + p, _mm256_mul_ps(_mm256_loadu_ps(s + p), inv));
    }
    for (int64_t p = whole; p < n; ++p) s[p] *= inv_total;
  }
};

// n a multiple of 16; the softmax is AVX2's (a few scores a row).
struct Avx512 : Avx2 {
  __attribute__((target("avx512f,avx2,fma"))) static __m512 load(const float* p) {
    return _mm512_loadu_ps(p);
  }
  __attribute__((target("avx512f,avx2,fma"))) static __m512 load(const Bf16* p) {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
  template <typename T>
  __attribute__((target("avx512f,avx2,fma"))) static float dot(const float* a, const T* b,
                                                               int64_t n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load(b + i), acc0);
      acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), load(b + i + 16), acc1);
    }
    if (i < n) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load(b + i), acc0);
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  }
  template <typename T>
  __attribute__((target("avx512f,avx2,fma"))) static void add_scaled(float* out, float weight,
                                                                     const T* x, int64_t n) {
    const __m512 w = _mm512_set1_ps(weight);
    for (int64_t i = 0; i < n; i += 16) {
      _mm512_storeu_ps(out + i, _mm512_fmadd_ps(w, load(x + i), _mm512_loadu_ps(out + i)));
    }
  }
};

bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
bool cpu_has_avx512() {
  static const bool yes = cpu_has_avx2() && __builtin_cpu_supports("avx512f");
  return yes;
}
#else
bool cpu_has_avx2() { return false; }
bool cpu_has_avx512() { return false; }
#endif

// One token's queries of the heads of key/value heads [g0, g1) against its
// context's rows [0, position].
struct TokenWork {
  const float* q;  // head h's query at q + h * head_stride
  float* out;      // likewise
  int64_t head_stride;
  const int64_t* rows;
  int64_t position, row_stride, g0, g1, groups, d;
  float scale;
};

template <typename Vec, typename T>
inline void attend_token(const TokenWork& a, const T* keys, const T* values,
                         std::vector<float>& scores) {
  const int64_t n = a.position + 1, first = a.g0 * a.groups, heads = (a.g1 - a.g0) * a.groups;
  scores.resize(static_cast<size_t>(heads * n));
  for (int64_t p = 0; p < n; ++p) {
    const T* row = keys + a.rows[p] * a.row_stride;
    for (int64_t j = 0; j < heads; ++j) {
      const int64_t h = first + j;
      scores[j * n + p] =
          a.scale * Vec::dot(a.q + h * a.head_stride, row + h / a.groups * a.d, a.d);
    }
  }
  for (int64_t j = 0; j < heads; ++j) {
    Vec::softmax(scores.data() + j * n, n);
    float* o = a.out + (first + j) * a.head_stride;
    std::fill(o, o + a.d, 0.0f);
  }
  for (int64_t p = 0; p < n; ++p) {
    const T* row = values + a.rows[p] * a.row_stride;
    for (int64_t j = 0; j < heads; ++j) {
      const int64_t h = first + j;
      Vec::add_scaled(a.out + h * a.head_stride, scores[j * n + p], row + h / a.groups * a.d, a.d);
    }
  }
}

template <typename T>
void attend_token_portable(const TokenWork& a, const T* keys, const T* values,
                           std::vector<float>& scores) {
  attend_token<Portable>(a, keys, values, scores);
}

#ifdef KOLOS_PAGED_AVX2
// flatten: the vector helpers inline here, under this function's target.
template <typename T>
__attribute__((target("avx2,fma"), flatten)) void attend_token_avx2(const TokenWork& a,
                                                                    const T* keys, const T* values,
                                                                    std::vector<float>& scores) {
  attend_token<Avx2>(a, keys, values, scores);
}
template <typename T>
__attribute__((target("avx512f,avx2,fma"), flatten)) void attend_token_avx512(
    const TokenWork& a, const T* keys, const T* values, std::vector<float>& scores) {
  attend_token<Avx512>(a, keys, values, scores);
}
#endif

template <typename T>
void run(const PagedAttentionArgs& args, const PagedAttentionChunk* chunks, size_t count,
         int threads) {
  const auto* keys = static_cast<const T*>(args.keys);
  const auto* values = static_cast<const T*>(args.values);
  const int64_t d = args.head_dim, kv_heads = args.kv_heads;
  const auto num_chunks = static_cast<int64_t>(count);
  int t = threads;
#ifdef _OPENMP
  if (t <= 0) t = omp_get_max_threads();
#endif
  t = std::max(1, t);
  const int64_t runs = std::min(kv_heads, (2 * t + num_chunks - 1) / num_chunks);
  const int64_t run_heads = (kv_heads + runs - 1) / runs;
  const bool avx2 = paged_attention_uses_avx2(d);
  const bool avx512 = avx2 && cpu_has_avx512() && d % 16 == 0;
  TokenWork base{};
  base.head_stride = args.tokens * d;
  base.row_stride = kv_heads * d;
  base.groups = args.heads / kv_heads;
  base.d = d;
  base.scale = args.scale;
  const int64_t items = num_chunks * runs;
  auto body = [&](int64_t item, std::vector<float>& scores) {
    const PagedAttentionChunk& c = chunks[item / runs];
    TokenWork a = base;
    a.rows = c.rows;
    a.g0 = item % runs * run_heads;
    a.g1 = std::min(kv_heads, a.g0 + run_heads);
    for (int64_t i = 0; i < c.length && a.g0 < a.g1; ++i) {
      a.q = args.q + (c.token + i) * d;
      a.out = args.out + (c.token + i) * d;
      a.position = c.start + i;
#ifdef KOLOS_PAGED_AVX2
      if (avx512) {
        attend_token_avx512(a, keys, values, scores);
        continue;
      }
      if (avx2) {
        attend_token_avx2(a, keys, values, scores);
        continue;
      }
#endif
      attend_token_portable(a, keys, values, scores);
    }
  };
  if (t == 1 || items == 1) {
    std::vector<float> scores;
    for (int64_t item = 0; item < items; ++item) body(item, scores);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(t)
  {
    std::vector<float> scores;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) body(item, scores);
  }
#endif
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("paged_attention: " + what);
}

}  // namespace

bool paged_attention_uses_avx2(int64_t head_dim) { return cpu_has_avx2() && head_dim % 8 == 0; }

void paged_attention(const PagedAttentionArgs& args, const PagedAttentionChunk* chunks,
                     size_t count, int threads) {
  if (count == 0) return;
  check(args.q != nullptr && args.out != nullptr && args.keys != nullptr && args.values != nullptr,
        "a null pointer");
  check(args.head_dim > 0 && args.kv_heads > 0 && args.heads % args.kv_heads == 0,
        "heads " + std::to_string(args.heads) + " are not groups of the " +
            std::to_string(args.kv_heads) + " key/value heads");
  for (size_t i = 0; i < count; ++i) {
    check(chunks[i].rows != nullptr && chunks[i].start >= 0 && chunks[i].length >= 0 &&
              chunks[i].token + chunks[i].length <= args.tokens,
          "chunk " + std::to_string(i) + " lies outside the step's " + std::to_string(args.tokens) +
              " tokens");
  }
  if (args.dtype == CacheDType::kFloat32) {
    run<float>(args, chunks, count, threads);
  } else {
    run<Bf16>(args, chunks, count, threads);
  }
}

}  // namespace kolos::inference
