// A float32 linear layer for inference on the CPU: y = x w^T + bias, with the
// weight packed once into column panels.
//
// Layout: the weight [out, in] is cut into panels of kLinearPanel (32) output
// features; panel p holds, for each input feature k in order, the 32 weights
// w[32 p .. 32 p + 31, k] side by side (the last panel zero-padded). A panel
// is read front to back, once for every block of rows of x, so a product of
// a few rows (a decoding step) streams each weight from memory once, at
// the memory's speed, with a software prefetch running ahead of the reads;
// a product of many rows reuses each panel from the cache for every block.
//
// Each output is fma(x[r, k], w[n, k], acc) over k in increasing order,
// starting from bias[n] (0 without a bias): every ISA level and thread count
// gives the same bits (isa.h). Against a plain product the sums differ only
// by rounding.
//
// `threads`: 0 uses omp_get_max_threads(). Threads split the output panels
// (and, for many rows, blocks of rows), never a sum; runs of panels go to
// whichever thread is free, so the bits never depend on the split.
#pragma once

#include <cstdint>

namespace kolos::kernels {

constexpr int64_t kLinearPanel = 32;

// The number of floats a packed [out, in] weight takes:
// ceil(out / 32) * 32 * in.
int64_t packed_linear_size(int64_t out, int64_t in);

// Packs `weight` (row-major [out, in]) into `packed` (packed_linear_size
// floats). Throws std::invalid_argument on a null pointer or a size < 1.
void pack_linear(const float* weight, int64_t out, int64_t in, float* packed, int threads = 0);

// y [rows, out] = x [rows, in] times the packed weight's transpose, plus
// `bias` [out] (may be null). x and y are row-major and contiguous and must
// not overlap. Throws std::invalid_argument on bad sizes or null pointers.
void packed_linear(const float* x, int64_t rows, const float* packed, const float* bias,
                   int64_t out, int64_t in, float* y, int threads = 0);

}  // namespace kolos::kernels
