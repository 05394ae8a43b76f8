#include <torch/torch.h>

#include <cmath>
#include <map>

#include "kolos/core/error.h"
#include "kolos/core/gradients.h"
#include "kolos/core/mesh.h"

namespace kolos {

double global_grad_norm(const std::vector<GradPiece>& pieces, const DeviceMesh& mesh) {
  // Sum of squares per set of sharded axes, then one all_reduce per set.
  std::map<uint8_t, double> sums;
  for (const auto& piece : pieces) {
    if (!piece.grad.defined()) continue;
    double sq = piece.grad.to(torch::kDouble).pow(2).sum().item<double>();
    sums[piece.placement.sharded().bits()] += sq;
  }
  // Every rank must reduce the same sets in the same order: the sets any
  // rank holds, agreed by a max over one flag per set.
  uint16_t mine = 0;
  for (const auto& [bits, sum] : sums) mine |= static_cast<uint16_t>(1u << bits);
  at::Tensor flags = torch::zeros({16}, torch::kInt64);
  for (int b = 0; b < 16; ++b) flags[b] = (mine >> b) & 1;
  mesh.world()->all_reduce(flags, comm::ReduceOp::kMax)->wait();
  double total = 0.0;
  for (int b = 0; b < 16; ++b) {
    if (flags[b].item<int64_t>() == 0) continue;
    double local = sums.count(b) ? sums[b] : 0.0;
    AxisSet axes(static_cast<uint8_t>(b));
    if (axes.empty() || mesh.layout().size(axes) == 1) {
      total += local;
      continue;
    }
    at::Tensor value = torch::tensor({local}, torch::kDouble);
    mesh.group(axes)->all_reduce(value, comm::ReduceOp::kSum)->wait();
    total += value.item<double>();
  }
  return std::sqrt(total);
}

AdamWSettings adamw_settings(const OptimConfig& config) {
  KOLOS_CHECK_KIND(kConfig, config.name == "adamw", "optim.name: unknown optimizer `",
                   config.name, "`; available: adamw");
  return AdamWSettings{config.lr, config.beta1, config.beta2, config.eps, config.weight_decay};
}

}  // namespace kolos
