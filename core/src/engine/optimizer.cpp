#include "kolos/core/optimizer.h"

#include <torch/torch.h>

#include <cmath>

#include "kolos/core/error.h"
#include "kolos/kernels/adamw.h"

namespace kolos {

AdamW::AdamW(AdamWSettings settings) : settings_(settings) {}

void AdamW::add(std::string name, at::Tensor param, at::Tensor grad, Placement placement) {
  KOLOS_CHECK(param.sizes() == grad.sizes(), "AdamW slot ", name, ": parameter shape ",
              param.sizes(), " differs from its gradient's ", grad.sizes());
  torch::NoGradGuard no_grad;
  const bool low = param.scalar_type() == at::kBFloat16 || param.scalar_type() == at::kHalf;
  // A low-precision parameter is stepped through an fp32 master: an AdamW
  // update moves a weight by about lr, which below half of the dtype's
  // spacing at the weight (bf16 near 1: 2^-8) would round away if applied
  // to the low copy.
  at::Tensor master = low ? param.detach().to(at::kFloat).contiguous() : at::Tensor();
  const at::Tensor& like = low ? master : param;
  AdamWSlot slot{std::move(name),
                 param,
                 grad,
                 std::move(placement),
                 torch::zeros_like(like, at::MemoryFormat::Contiguous),
                 torch::zeros_like(like, at::MemoryFormat::Contiguous),
                 master};
  slots_.push_back(std::move(slot));
}

namespace {

kernels::DType kernel_dtype(at::ScalarType type) {
  return type == at::kBFloat16 ? kernels::DType::kBFloat16
         : type == at::kHalf   ? kernels::DType::kFloat16
                               : kernels::DType::kFloat32;
}

// The fused kernel takes flat CPU buffers: fp32 parameter (the master when
// there is one) and moments, a gradient in fp32, bf16 or fp16, and
// optionally a bf16/fp16 copy of the parameter to write.
bool fusable(const AdamWSlot& s) {
  const at::Tensor& param = s.master.defined() ? s.master : s.param;
  for (const at::Tensor* t : {&param, &s.grad, &s.exp_avg, &s.exp_avg_sq, &s.param}) {
    if (!t->defined() || !t->device().is_cpu() || !t->is_contiguous() ||
        t->numel() != param.numel())
      return false;
  }
  for (const at::Tensor* t : {&param, &s.exp_avg, &s.exp_avg_sq}) {
    if (t->scalar_type() != at::kFloat) return false;
  }
  const auto g = s.grad.scalar_type();
  return g == at::kFloat || g == at::kBFloat16 || g == at::kHalf;
}

// Whether LibTorch's CPU kernels round AdamW's moments with fused
// multiply-adds, as the fused kernel does: ATen's AVX2/AVX-512 kernels do,
// its "default" ones (ATEN_CPU_CAPABILITY=default, CPUs without AVX2) do not.
// Probed once on LibTorch itself with inputs where the two differ, so that
// kolos::AdamW gives LibTorch's bits either way (no fused kernel otherwise).
bool libtorch_moments_use_fma() {
  static const bool fma = [] {
    torch::NoGradGuard no_grad;
    const float a = 1.0f + std::ldexp(1.0f, -23);
    at::Tensor grad = torch::full({64}, a);
    at::Tensor m = torch::full({64}, -1.0f).add_(grad, a);
    at::Tensor v = torch::full({64}, -1.0f).addcmul_(grad, grad, a);
    const float a2 = a * a;
    return m[0].item<float>() == std::fma(a, a, -1.0f) &&
           v[0].item<float>() == std::fma(a2, a, -1.0f);
  }();
  return fma;
}

}  // namespace

void AdamW::step(double lr) {
  ++step_;
  update(lr, 0, slots_.size(), step_);
}

void AdamW::update(double lr, size_t first, size_t last, int64_t step) {
  KOLOS_CHECK(first <= last && last <= slots_.size() && step >= 1, "AdamW::update: slots [",
              first, ", ", last, ") of ", slots_.size(), " at step ", step);
  torch::NoGradGuard no_grad;
  std::vector<kernels::AdamWBuffer> fused;
  const double beta1 = settings_.beta1, beta2 = settings_.beta2;
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  const double step_size = lr / bias_correction1;
  const double denom_scale = std::sqrt(bias_correction2);
  for (size_t i = first; i < last; ++i) {
    AdamWSlot& s = slots_[i];
    if (settings_.fused && fusable(s) && libtorch_moments_use_fma()) {
      kernels::AdamWBuffer b;
      if (s.master.defined()) {
        b.param = s.master.data_ptr<float>();
        b.param_copy = s.param.data_ptr();
        b.copy_dtype = kernel_dtype(s.param.scalar_type());
      } else {
        b.param = s.param.data_ptr<float>();
      }
      b.grad = s.grad.data_ptr();
      b.grad_dtype = kernel_dtype(s.grad.scalar_type());
      b.exp_avg = s.exp_avg.data_ptr<float>();
      b.exp_avg_sq = s.exp_avg_sq.data_ptr<float>();
      b.numel = s.param.numel();
      fused.push_back(b);
      continue;
    }
    at::Tensor& param = s.master.defined() ? s.master : s.param;
    const at::Tensor grad = s.grad.scalar_type() == param.scalar_type()
                                ? s.grad
                                : s.grad.to(param.scalar_type());
    if (settings_.weight_decay != 0) param.mul_(1 - lr * settings_.weight_decay);
    s.exp_avg.mul_(beta1).add_(grad, 1 - beta1);
    s.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    at::Tensor denom = (s.exp_avg_sq.sqrt() / denom_scale).add_(settings_.eps);
    param.addcdiv_(s.exp_avg, denom, -step_size);
    if (s.master.defined()) s.param.copy_(s.master);
  }
  if (!fused.empty()) {
    kernels::AdamWConfig config;
    config.lr = lr;
    config.beta1 = beta1;
    config.beta2 = beta2;
    config.eps = settings_.eps;
    config.weight_decay = settings_.weight_decay;
    config.step = step;
    kernels::adamw_step(fused.data(), fused.size(), config, at::get_num_threads());
  }
}

std::vector<StatePiece> AdamW::state_pieces() const {
  std::vector<StatePiece> pieces;
  for (const auto& s : slots_) {
    pieces.push_back(StatePiece{"exp_avg/" + s.name, s.exp_avg, s.placement});
    pieces.push_back(StatePiece{"exp_avg_sq/" + s.name, s.exp_avg_sq, s.placement});
  }
  return pieces;
}

at::Tensor AdamW::master_of(const at::Tensor& param) const {
  for (const auto& s : slots_) {
    if (s.param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return s.master;
  }
  return {};
}

void AdamW::copy_masters_to_params() {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    if (s.master.defined()) s.param.copy_(s.master);
  }
}

int64_t AdamW::master_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : slots_) {
    if (s.master.defined()) bytes += s.master.numel() * s.master.element_size();
  }
  return bytes;
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : slots_) {
    bytes += s.exp_avg.numel() * s.exp_avg.element_size();
    bytes += s.exp_avg_sq.numel() * s.exp_avg_sq.element_size();
  }
  return bytes;
}

}  // namespace kolos
