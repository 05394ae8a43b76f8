// Inference on the CPU: a linear layer's weight packed once, so that each
// product reads it as it is.
//
// LibTorch's CPU linear (MKL's sgemm) copies the weight into its own layout
// on every call. In a decoding step of a few tokens per sequence the product
// is small and that copy is a large part of its time (docs/inference.md,
// "Packed weights", has the profile). Two packings, chosen once per process:
//   - kolos's own panels (kolos/kernels/linear.h), on CPUs with AVX2 or
//     AVX-512 (kolos::kernels::active_isa(); KOLOS_CPU_ISA=scalar turns it
//     off): the weight streams from memory once per product, with a
//     prefetch running ahead, which is what a decoding step of a few rows
//     is bound by;
//   - otherwise oneDNN's blocked layout, through the operators LibTorch
//     registers for its own CPU inference (mkldnn::_reorder_linear_weight
//     and mkldnn::_linear_pointwise);
//   - neither: nothing is packed and the layers keep the plain product.
//
// Float32 weights only: on CPUs without bf16 instructions a bf16 product is
// emulated, slower than LibTorch's own.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace kolos {

class PackedLinear {
 public:
  enum class Kernel { kNone, kPanels, kOneDnn };
  // The packing this process uses (decided at the first call).
  static Kernel kernel();
  // "kolos panels, avx512" / "oneDNN" / "none", for the logs.
  static std::string kernel_name();
  // Whether anything packs here: kernel() != kNone.
  static bool available();
  // Whether `kernel` can run here (kPanels: AVX2 or better; kOneDnn:
  // LibTorch's operators).
  static bool available(Kernel kernel);
  // Whether `weight` can be packed here: available(), and a non-empty 2-D
  // float32 CPU tensor.
  static bool packs(const at::Tensor& weight);

  PackedLinear() = default;
  // weight: [out, in], float32, on the CPU. `kernel`: this process's unless
  // given (benchmarks and tests compare the two).
  explicit PackedLinear(const at::Tensor& weight, Kernel kernel = PackedLinear::kernel());

  bool defined() const { return packed_.defined(); }
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }

  // x [..., in] (float32, on the CPU) times the weight's transpose, plus
  // bias [out] if it is defined: at::linear(x, weight, bias) to rounding.
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& bias = {}) const;

 private:
  at::Tensor packed_;  // kolos's panels or oneDNN's opaque layout
  Kernel kernel_ = Kernel::kNone;
  int64_t out_ = 0, in_ = 0;
};

}  // namespace kolos
