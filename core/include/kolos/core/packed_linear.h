// Inference on the CPU: a linear layer's weight packed once into oneDNN's
// blocked layout, so that each product reads it as it is.
//
// LibTorch's CPU linear (MKL's sgemm) copies the weight into its own layout
// on every call. In a decoding step of a few tokens per sequence the product
// is small and that copy is a large part of its time (docs/inference.md,
// "Packed weights", has the profile). The packing goes through the oneDNN
// operators LibTorch registers for its own CPU inference
// (mkldnn::_reorder_linear_weight and mkldnn::_linear_pointwise); a
// LibTorch built without them packs nothing and the layers keep the plain
// product.
//
// Float32 weights only: on CPUs without bf16 instructions oneDNN emulates
// bf16 products, slower than LibTorch's own.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace kolos {

class PackedLinear {
 public:
  // Whether this LibTorch has the oneDNN operators.
  static bool available();
  // Whether `weight` can be packed here: available(), and a non-empty 2-D
  // float32 CPU tensor.
  static bool packs(const at::Tensor& weight);

  PackedLinear() = default;
  // weight: [out, in], float32, on the CPU.
  explicit PackedLinear(const at::Tensor& weight);

  bool defined() const { return packed_.defined(); }
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }

  // x [..., in] (float32, on the CPU) times the weight's transpose, plus
  // bias [out] if it is defined: at::linear(x, weight, bias) to rounding.
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& bias = {}) const;

 private:
  at::Tensor packed_;  // oneDNN's opaque layout
  int64_t out_ = 0, in_ = 0;
};

}  // namespace kolos
