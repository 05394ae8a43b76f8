#include "kolos/core/optimizer.h"

#include <torch/torch.h>

#include <cmath>

#include "kolos/core/error.h"

namespace kolos {

AdamW::AdamW(AdamWSettings settings) : settings_(settings) {}

void AdamW::add(std::string name, at::Tensor param, at::Tensor grad, Placement placement) {
  KOLOS_CHECK(param.sizes() == grad.sizes(), "AdamW slot ", name, ": parameter shape ",
              param.sizes(), " differs from its gradient's ", grad.sizes());
  torch::NoGradGuard no_grad;
  AdamWSlot slot{std::move(name), param, grad, std::move(placement),
                 torch::zeros_like(param, at::MemoryFormat::Contiguous),
                 torch::zeros_like(param, at::MemoryFormat::Contiguous)};
  slots_.push_back(std::move(slot));
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_;
  const double beta1 = settings_.beta1, beta2 = settings_.beta2;
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step_));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step_));
  const double step_size = lr / bias_correction1;
  const double denom_scale = std::sqrt(bias_correction2);
  for (auto& s : slots_) {
    if (settings_.weight_decay != 0) s.param.mul_(1 - lr * settings_.weight_decay);
    s.exp_avg.mul_(beta1).add_(s.grad, 1 - beta1);
    s.exp_avg_sq.mul_(beta2).addcmul_(s.grad, s.grad, 1 - beta2);
    at::Tensor denom = (s.exp_avg_sq.sqrt() / denom_scale).add_(settings_.eps);
    s.param.addcdiv_(s.exp_avg, denom, -step_size);
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

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : slots_) {
    bytes += s.exp_avg.numel() * s.exp_avg.element_size();
    bytes += s.exp_avg_sq.numel() * s.exp_avg_sq.element_size();
  }
  return bytes;
}

}  // namespace kolos
