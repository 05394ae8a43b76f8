// Thin LibTorch wrappers over the CUDA kernels of cuda.h: they check device,
// dtype (fp32), contiguity and shapes, then launch on the current CUDA
// stream. Built (library kolos_kernels_torch_cuda) only when the LibTorch
// found by CMake was built with CUDA; the Debian CPU LibTorch is not, so
// there these are compiled (syntax-checked) but not linked.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

#include "kolos/kernels/adamw.h"

namespace kolos::kernels::cuda {

// Updates every params[i] (with grads[i], exp_avgs[i], exp_avg_sqs[i]) in
// one multi-tensor AdamW step.
void adamw_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                const std::vector<at::Tensor>& exp_avgs,
                const std::vector<at::Tensor>& exp_avg_sqs, const AdamWConfig& config);

// (y, mean, rstd) of LayerNorm over the last dimension; gamma/beta may be
// undefined tensors.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward(const at::Tensor& x,
                                                                  const at::Tensor& gamma,
                                                                  const at::Tensor& beta,
                                                                  double eps);
// (dx, dgamma, dbeta); dgamma/dbeta undefined when gamma is.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
    const at::Tensor& gamma);

// Causal softmax over the last dimension of x[..., q_len, cols].
at::Tensor softmax_causal_forward(const at::Tensor& x, double scale);
at::Tensor softmax_causal_backward(const at::Tensor& y, const at::Tensor& dy, double scale);

}  // namespace kolos::kernels::cuda
