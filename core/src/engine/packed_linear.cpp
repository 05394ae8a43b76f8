#include "kolos/core/packed_linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <optional>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/kernels/isa.h"
#include "kolos/kernels/linear.h"

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

bool onednn_available() {
  return at::hasMKLDNN() && reorder_op().has_value() && product_op().has_value();
}

}  // namespace

bool PackedLinear::available(Kernel kernel) {
  switch (kernel) {
    case Kernel::kPanels:
      return kernels::active_isa() >= kernels::Isa::kAvx2;
    case Kernel::kOneDnn:
      return onednn_available();
    case Kernel::kNone:
      break;
  }
  return false;
}

PackedLinear::Kernel PackedLinear::kernel() {
  static const Kernel chosen = available(Kernel::kPanels)   ? Kernel::kPanels
                               : available(Kernel::kOneDnn) ? Kernel::kOneDnn
                                                            : Kernel::kNone;
  return chosen;
}

std::string PackedLinear::kernel_name() {
  switch (kernel()) {
    case Kernel::kPanels:
      return std::string("kolos panels, ") + kernels::isa_name(kernels::active_isa());
    case Kernel::kOneDnn:
      return "oneDNN";
    case Kernel::kNone:
      break;
  }
  return "none";
}

bool PackedLinear::available() { return kernel() != Kernel::kNone; }

bool PackedLinear::packs(const at::Tensor& weight) {
  return available() && weight.defined() && weight.dim() == 2 && weight.numel() > 0 &&
         weight.scalar_type() == at::kFloat && weight.device().is_cpu();
}

PackedLinear::PackedLinear(const at::Tensor& weight, Kernel kernel) {
  KOLOS_CHECK(kernel != Kernel::kNone && available(kernel), "PackedLinear: ",
              kernel == Kernel::kPanels ? "kolos's panels need a CPU with AVX2"
                                        : "this LibTorch has no oneDNN linear operators");
  KOLOS_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
              "PackedLinear packs a 2-D float32 CPU weight, not ", weight.scalar_type(), " ",
              weight.sizes(), " on ", weight.device());
  out_ = weight.size(0);
  in_ = weight.size(1);
  kernel_ = kernel;
  if (kernel_ == Kernel::kPanels) {
    const at::Tensor w = weight.detach().contiguous();
    packed_ = at::empty({kernels::packed_linear_size(out_, in_)}, w.options());
    kernels::pack_linear(w.data_ptr<float>(), out_, in_, packed_.data_ptr<float>(),
                         at::get_num_threads());
    return;
  }
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
  if (kernel_ == Kernel::kPanels) {
    KOLOS_CHECK(!bias.defined() || (bias.scalar_type() == at::kFloat && bias.numel() == out_),
                "a packed linear layer of ", in_, " -> ", out_,
                " features takes a float32 bias of ", out_, " elements, not ", bias.scalar_type(),
                " ", bias.sizes());
    const at::Tensor rows = x.reshape({-1, in_}).contiguous();
    const at::Tensor b = bias.defined() ? bias.contiguous() : at::Tensor();
    at::Tensor y = at::empty({rows.size(0), out_}, rows.options());
    kernels::packed_linear(rows.data_ptr<float>(), rows.size(0), packed_.data_ptr<float>(),
                           b.defined() ? b.data_ptr<float>() : nullptr, out_, in_,
                           y.data_ptr<float>(), at::get_num_threads());
    return y.view(shape);
  }
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
