// Activations for inference on the CPU.
//
// gelu_tanh: GELU's tanh form, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715
// x^3))), computed as x / (1 + e^-2u), which needs one exponential and no
// tanh and stays accurate where 1 + tanh(u) cancels (large negative x). The
// exponential is a polynomial of the fraction times a power of two built in
// the exponent bits; every ISA level and thread count gives the same bits
// (isa.h), within a few units in the last place of the value computed in
// double (kernels_cpu_test measures it). A NaN stays a NaN.
//
// `threads`: 0 uses omp_get_max_threads(); threads split the elements.
#pragma once

#include <cstdint>

namespace kolos::kernels {

// y[i] = gelu_tanh(x[i]) for i < n; y may be x (in place), otherwise the two
// must not overlap. Throws std::invalid_argument on a null pointer (n > 0)
// or n < 0.
void gelu_tanh(const float* x, float* y, int64_t n, int threads = 0);

}  // namespace kolos::kernels
