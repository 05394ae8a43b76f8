// Gradient L2 norm over many tensors, and scaling (for clipping).
//
// The sum of squares accumulates in double: each fp32 square is exact in
// double, elements are summed into 16 lanes (element i of a chunk into lane
// i mod 16), lanes in a fixed tree, chunks in order. So the result is the
// same bits on every ISA level and for every thread count: clipping does
// not make runs CPU-dependent. A NaN or Inf anywhere gives a NaN or Inf sum.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kolos/kernels/dtype.h"

namespace kolos::kernels {

struct GradBuffer {
  void* data = nullptr;  // `const` for the reading functions
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
};

// Sum over every buffer of the squares of its elements.
double sum_of_squares(const GradBuffer* buffers, size_t count, int threads = 0);
// sqrt(sum_of_squares(...)).
double l2_norm(const GradBuffer* buffers, size_t count, int threads = 0);
// x *= factor, in place (bf16/fp16 rounded back as convert.h says).
void scale(const GradBuffer* buffers, size_t count, float factor, int threads = 0);
// torch.nn.utils.clip_grad_norm_: norm = l2_norm; if max_norm / (norm + 1e-6)
// < 1, scales every buffer by it. Returns the norm before clipping. A
// non-finite norm scales nothing (the caller decides to skip the step).
double clip_grad_norm(const GradBuffer* buffers, size_t count, double max_norm,
                      int threads = 0);

}  // namespace kolos::kernels
