// LibTorch wrappers over the plain-pointer CUDA kernels (see cuda_torch.h).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kolos/kernels/cuda.h"
#include "kolos/kernels/cuda_torch.h"

namespace kolos::kernels::cuda {
namespace {

void check_fp32_cuda(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous(),
              "kolos CUDA kernels: ", what, " must be a contiguous float32 CUDA tensor, got ",
              t.defined() ? t.toString() : std::string("an undefined tensor"));
}

const float* optional_ptr(const at::Tensor& t, int64_t cols, const char* what) {
  if (!t.defined()) return nullptr;
  check_fp32_cuda(t, what);
  TORCH_CHECK(t.numel() == cols, "kolos CUDA kernels: ", what, " has ", t.numel(),
              " elements, expected ", cols);
  return t.data_ptr<float>();
}

}  // namespace

void adamw_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                const std::vector<at::Tensor>& exp_avgs,
                const std::vector<at::Tensor>& exp_avg_sqs, const AdamWConfig& config) {
  TORCH_CHECK(params.size() == grads.size() && params.size() == exp_avgs.size() &&
                  params.size() == exp_avg_sqs.size(),
              "kolos CUDA adamw_step: list sizes differ");
  if (params.empty()) return;
  const c10::cuda::CUDAGuard guard(params[0].device());
  std::vector<AdamWTensor> tensors(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    for (const at::Tensor* t : {&params[i], &grads[i], &exp_avgs[i], &exp_avg_sqs[i]}) {
      check_fp32_cuda(*t, "adamw_step operand");
      TORCH_CHECK(t->numel() == params[i].numel() && t->device() == params[0].device(),
                  "kolos CUDA adamw_step: tensor ", i, " operands differ in size or device");
    }
    tensors[i] = AdamWTensor{params[i].data_ptr<float>(), grads[i].data_ptr<float>(),
                             exp_avgs[i].data_ptr<float>(), exp_avg_sqs[i].data_ptr<float>(),
                             params[i].numel()};
  }
  adamw_step(tensors.data(), tensors.size(), config, c10::cuda::getCurrentCUDAStream().stream());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward(const at::Tensor& x,
                                                                  const at::Tensor& gamma,
                                                                  const at::Tensor& beta,
                                                                  double eps) {
  check_fp32_cuda(x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty({rows}, x.options()), rstd = at::empty({rows}, x.options());
  layer_norm_forward(x.data_ptr<float>(), optional_ptr(gamma, cols, "gamma"),
                     optional_ptr(beta, cols, "beta"), y.data_ptr<float>(),
                     mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols,
                     static_cast<float>(eps), c10::cuda::getCurrentCUDAStream().stream());
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
    const at::Tensor& gamma) {
  check_fp32_cuda(dy, "dy");
  check_fp32_cuda(x, "x");
  check_fp32_cuda(mean, "mean");
  check_fp32_cuda(rstd, "rstd");
  TORCH_CHECK(dy.sizes() == x.sizes(), "kolos CUDA layer_norm_backward: dy and x differ in shape");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  at::Tensor dx = at::empty_like(x), dgamma, dbeta;
  if (gamma.defined()) {
    dgamma = at::empty({cols}, x.options());
    dbeta = at::empty({cols}, x.options());
  }
  layer_norm_backward(dy.data_ptr<float>(), x.data_ptr<float>(), mean.data_ptr<float>(),
                      rstd.data_ptr<float>(), optional_ptr(gamma, cols, "gamma"),
                      dx.data_ptr<float>(), dgamma.defined() ? dgamma.data_ptr<float>() : nullptr,
                      dbeta.defined() ? dbeta.data_ptr<float>() : nullptr, rows, cols,
                      c10::cuda::getCurrentCUDAStream().stream());
  return {dx, dgamma, dbeta};
}

at::Tensor softmax_causal_forward(const at::Tensor& x, double scale) {
  check_fp32_cuda(x, "x");
  TORCH_CHECK(x.dim() >= 2, "kolos CUDA softmax_causal_forward: x needs [..., q_len, cols]");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t cols = x.size(-1), q_len = x.size(-2), rows = x.numel() / cols;
  at::Tensor y = at::empty_like(x);
  softmax_causal_forward(x.data_ptr<float>(), y.data_ptr<float>(), rows, cols, q_len,
                         static_cast<float>(scale), c10::cuda::getCurrentCUDAStream().stream());
  return y;
}

at::Tensor softmax_causal_backward(const at::Tensor& y, const at::Tensor& dy, double scale) {
  check_fp32_cuda(y, "y");
  check_fp32_cuda(dy, "dy");
  TORCH_CHECK(y.sizes() == dy.sizes() && y.dim() >= 2,
              "kolos CUDA softmax_causal_backward: y and dy must have one shape [..., q_len, cols]");
  const c10::cuda::CUDAGuard guard(y.device());
  const int64_t cols = y.size(-1), q_len = y.size(-2), rows = y.numel() / cols;
  at::Tensor dx = at::empty_like(y);
  softmax_causal_backward(y.data_ptr<float>(), dy.data_ptr<float>(), dx.data_ptr<float>(), rows,
                          cols, q_len, static_cast<float>(scale),
                          c10::cuda::getCurrentCUDAStream().stream());
  return dx;
}

}  // namespace kolos::kernels::cuda
