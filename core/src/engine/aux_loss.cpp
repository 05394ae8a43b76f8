#include "kolos/core/aux_loss.h"

#include <torch/torch.h>

#include <atomic>

namespace kolos {
namespace {

std::atomic<double> g_multiplier{1.0};

struct WithAuxLoss : torch::autograd::Function<WithAuxLoss> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& aux) {
    ctx->saved_data["aux_shape"] = aux.sizes().vec();
    ctx->saved_data["aux_dtype"] = static_cast<int64_t>(aux.scalar_type());
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto shape = ctx->saved_data["aux_shape"].toIntVector();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["aux_dtype"].toInt());
    at::Tensor aux_grad = torch::full(shape, aux_loss_multiplier(),
                                      torch::TensorOptions().dtype(dtype).device(grad[0].device()));
    return {grad[0], aux_grad};
  }
};

}  // namespace

at::Tensor with_aux_loss(const at::Tensor& x, const at::Tensor& aux) {
  if (!aux.requires_grad()) return x;
  return WithAuxLoss::apply(x, aux);
}

void set_aux_loss_multiplier(double multiplier) { g_multiplier.store(multiplier); }
double aux_loss_multiplier() { return g_multiplier.load(); }

}  // namespace kolos
