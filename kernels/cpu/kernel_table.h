// The per-ISA kernels behind the public functions (private to kernels/cpu).
//
// Each ISA level fills one KernelTable in its own translation unit
// (scalar.cpp, avx2.cpp, avx512.cpp); only the functions in that unit carry
// the level's target attribute, so nothing outside them can contain an
// instruction the running CPU may lack. dispatch.cpp picks the table of
// active_isa() and splits the work over threads; the table functions are
// single-threaded and take any n >= 0.
#pragma once

#include <cstdint>

#include "kolos/kernels/adamw.h"
#include "kolos/kernels/dtype.h"
#include "kolos/kernels/linear.h"

namespace kolos::kernels::detail {

// The fp32 scalars of one AdamW step, rounded from double as LibTorch does.
struct AdamWScalars {
  float weight_decay_factor;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
  float grad_scale;
};

// Copy kinds of AdamW's optional low-precision parameter copy.
enum CopyKind : int { kNoCopy = 0, kCopyF32 = 1, kCopyBF16 = 2, kCopyF16 = 3 };
constexpr int kGradKinds = 3;  // DType values
constexpr int kCopyKinds = 4;

using AdamWFn = void (*)(float* p, const void* g, float* m, float* v, void* copy, int64_t n,
                         const AdamWScalars& s);
using ToFloatFn = void (*)(const uint16_t* src, float* dst, int64_t n);
using FromFloatFn = void (*)(const float* src, uint16_t* dst, int64_t n);
// Adds x[i]^2 to lanes[i % 16] in increasing i (x starts a 16-aligned run).
using SumSquaresFn = void (*)(const void* x, int64_t n, double lanes[16]);
using ScaleFn = void (*)(void* x, int64_t n, float factor);
// One panel of a packed linear weight (linear.h) times `rows` rows of x
// (stride `in`): y[r, c] for c < cols (<= kLinearPanel), y's rows `ldy`
// apart; bias: the panel's first bias, or null.
using LinearPanelFn = void (*)(const float* x, int64_t rows, int64_t in, const float* panel,
                               const float* bias, int64_t cols, float* y, int64_t ldy);

// GELU's tanh form over n floats (activation.h); y may be x.
using GeluFn = void (*)(const float* x, float* y, int64_t n);
// Its constants, one set for every level: y = x / (1 + e^t) with
// t = kGeluT * (x + kGeluCubic x^3) (-2 sqrt(2 / pi): 0.5 (1 + tanh(u)) is
// 1 / (1 + e^-2u)); e^t = 2^k e^r, k = nearest(t log2 e), r = t - k ln 2
// (ln 2 in two parts), e^r by its degree-7 Taylor polynomial in Horner
// form (kExpTaylor from the highest term), t clamped to [kExpLow, kExpHigh]
// so that 2^k stays a normal float (a NaN passes through).
constexpr float kGeluCubic = 0.044715f;
constexpr float kGeluT = -1.5957691216057308f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpLow = -87.0f, kExpHigh = 88.0f;
constexpr float kExpTaylor[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                                 1.0f / 6,    0.5f,       1.0f,       1.0f};

// How far ahead of its reads a linear panel prefetches: 64 rows of the
// panel (8 KiB). The hardware's own prefetcher stops at every 4 KiB page,
// and a product of a few rows reads too little per page to hide that
// (bench_packed_linear shows the products against the bandwidth bound;
// distances of 8 to 256 rows were tried on a 2-core Xeon, 64 was fastest).
constexpr int64_t kLinearPrefetchRows = 64;
// A linear product of fewer rows than this streams the weights at the
// memory's speed with few tiles to hide their latency: dispatch.cpp gives
// each thread one range of panels, and the AVX2 level's first tile of a
// panel prefetches its rows into the first-level cache. With more rows,
// the AVX2 block's 32 KiB of the panel (both halves) and x's rows
// overflow that cache, and that prefetch made products slower on an AMD
// Zen (the 73 products of a GPT-2 step at 256 rows, two threads: 721-742
// ms with it, 514-700 without; docs/inference.md, "Packed weights").
constexpr int64_t kLinearFewRows = 8;
// The inputs a linear panel's tiles go through together before the next
// ones (avx2.cpp): 256 rows of a panel, 32 KiB.
constexpr int64_t kLinearInputBlock = 256;

struct KernelTable {
  AdamWFn adamw[kGradKinds][kCopyKinds];
  ToFloatFn bf16_to_fp32, fp16_to_fp32;
  FromFloatFn fp32_to_bf16, fp32_to_fp16;
  SumSquaresFn sum_squares[kGradKinds];
  ScaleFn scale[kGradKinds];
  LinearPanelFn linear_panel;
  GeluFn gelu_tanh;
};

// The scalars of `config`, checked (step >= 1); shared with the CUDA kernels
// so that both round them alike.
AdamWScalars adamw_scalars(const AdamWConfig& config);

// The table of the kernels the expanding translation unit defines: the
// function templates adamw<G, C>, sum_squares<G> and scale<G>, the four
// converters, linear_panel and gelu_tanh, found unqualified in that unit (each ISA's
// are in its own anonymous namespace, with its own target attribute). One list for every
// ISA, so that a kernel added to the table is added to all of them.
#define KOLOS_KERNEL_TABLE()                                                                   \
  [] {                                                                                         \
    KernelTable t{};                                                                           \
    const AdamWFn rows[kGradKinds][kCopyKinds] = {                                             \
        {&adamw<0, kNoCopy>, &adamw<0, kCopyF32>, &adamw<0, kCopyBF16>, &adamw<0, kCopyF16>},  \
        {&adamw<1, kNoCopy>, &adamw<1, kCopyF32>, &adamw<1, kCopyBF16>, &adamw<1, kCopyF16>},  \
        {&adamw<2, kNoCopy>, &adamw<2, kCopyF32>, &adamw<2, kCopyBF16>, &adamw<2, kCopyF16>}}; \
    for (int gk = 0; gk < kGradKinds; ++gk)                                                    \
      for (int ck = 0; ck < kCopyKinds; ++ck) t.adamw[gk][ck] = rows[gk][ck];                  \
    t.bf16_to_fp32 = &bf16_to_fp32;                                                            \
    t.fp16_to_fp32 = &fp16_to_fp32;                                                            \
    t.fp32_to_bf16 = &fp32_to_bf16;                                                            \
    t.fp32_to_fp16 = &fp32_to_fp16;                                                            \
    t.sum_squares[0] = &sum_squares<0>;                                                        \
    t.sum_squares[1] = &sum_squares<1>;                                                        \
    t.sum_squares[2] = &sum_squares<2>;                                                        \
    t.scale[0] = &scale<0>;                                                                    \
    t.scale[1] = &scale<1>;                                                                    \
    t.scale[2] = &scale<2>;                                                                    \
    t.linear_panel = &linear_panel;                                                            \
    t.gelu_tanh = &gelu_tanh;                                                                  \
    return t;                                                                                  \
  }()

const KernelTable& scalar_table();
const KernelTable& avx2_table();
const KernelTable& avx512_table();
const KernelTable& avx512_bf16_table();

}  // namespace kolos::kernels::detail
