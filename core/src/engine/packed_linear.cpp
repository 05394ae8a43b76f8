#include "kolos/core/packed_linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <optional>
#include <vector>

#include "kolos/core/error.h"

namespace kolos {
namespace {

std::optional<c10::OperatorHandle> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchema({name, ""});
}

const std::optional<c10::OperatorHandle>& reorder_op() {
  static const auto op = find_op("mkldnn::_reorder_linear_weight");
  return op;
}

const std::optional<c10::OperatorHandle>& product_op() {
  static const auto op = find_op("mkldnn::_linear_pointwise");
  return op;
}

}  // namespace

bool PackedLinear::available() {
  return at::hasMKLDNN() && reorder_op().has_value() && product_op().has_value();
}

bool PackedLinear::packs(const at::Tensor& weight) {
  return available() && weight.defined() && weight.dim() == 2 && weight.numel() > 0 &&
         weight.scalar_type() == at::kFloat && weight.device().is_cpu();
}

PackedLinear::PackedLinear(const at::Tensor& weight) {
  KOLOS_CHECK(available(), "PackedLinear: this LibTorch has no oneDNN linear operators");
  KOLOS_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
              "PackedLinear packs a 2-D float32 CPU weight, not ", weight.scalar_type(), " ",
              weight.sizes(), " on ", weight.device());
  out_ = weight.size(0);
  in_ = weight.size(1);
  // _reorder_linear_weight(Tensor self, int? batch_size=None): no batch
  // size, so one layout serves decoding steps and prefill chunks alike.
  std::vector<c10::IValue> stack{weight.detach().contiguous(), c10::IValue()};
  reorder_op()->callBoxed(&stack);
  packed_ = stack.at(0).toTensor();
}

at::Tensor PackedLinear::operator()(const at::Tensor& x, const at::Tensor& bias) const {
  KOLOS_CHECK(defined(), "PackedLinear: no weight packed");
  KOLOS_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.size(-1) == in_,
              "a packed linear layer of ", in_, " -> ", out_,
              " features takes float32 CPU input with ", in_, " features, not ", x.scalar_type(),
              " ", x.sizes(), " on ", x.device());
  KOLOS_CHECK(!(at::GradMode::is_enabled() && x.requires_grad()),
              "a packed linear layer is for inference: it records no gradient");
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out_;
  // _linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr,
  //                   Scalar?[] scalars, str? algorithm)
  // The constant arguments, made once: no post-op, no scalars.
  static const c10::IValue no_post_op(std::string("none"));
  static const c10::IValue no_scalars(c10::List<std::optional<at::Scalar>>{});
  std::vector<c10::IValue> stack{x.reshape({-1, in_}).contiguous(),
                                 packed_,
                                 bias.defined() ? c10::IValue(bias) : c10::IValue(),
                                 no_post_op,
                                 no_scalars,
                                 c10::IValue()};
  product_op()->callBoxed(&stack);
  return stack.at(0).toTensor().view(shape);
}

}  // namespace kolos
