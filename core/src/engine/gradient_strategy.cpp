#include <torch/torch.h>

#include <cmath>
#include <map>

#include "kolos/core/error.h"
#include "kolos/core/gradient_strategy.h"
#include "kolos/core/mesh.h"
#include "kolos/core/optimizer.h"

namespace kolos {

// Each distinct piece counted once. Pieces are grouped by their set S of
// sharded axes; a group's squares are summed over the mesh group of S, whose
// ranks hold the group's other pieces. Ranks that differ along any other
// axis hold the same pieces with the same (reduced) gradients and compute
// the same sum on their own, with no communication, except along pp: there
// ranks hold different blocks, and a weight that several stages hold (a
// tied embedding) must be counted by one of them. So under pipelining each
// group is also summed over pp, and a piece not sharded along pp is counted
// only by its canonical replica along pp (Placement::is_canonical_replica,
// the stage that checkpoints it).
double global_grad_norm(const std::vector<GradPiece>& pieces, const DeviceMesh& mesh) {
  // Each piece's norm in its own dtype, no copies.
  std::vector<at::Tensor> norms;
  std::vector<Placement> placements;
  for (const auto& piece : pieces) {
    if (!piece.grad.defined() || piece.grad.numel() == 0) continue;
    norms.push_back(piece.grad.norm());
    placements.push_back(piece.placement);
  }
  return global_grad_norm(norms, placements, mesh);
}

double global_grad_norm(const std::vector<at::Tensor>& piece_norms,
                        const std::vector<Placement>& placements, const DeviceMesh& mesh) {
  KOLOS_CHECK(piece_norms.size() == placements.size(), "global_grad_norm: ",
              piece_norms.size(), " norms for ", placements.size(), " placements");
  const AxisSet varying = mesh.size(Axis::kPP) > 1 ? AxisSet{Axis::kPP} : AxisSet{};
  const Coords coords = mesh.layout().coords(mesh.rank());
  // Per set of sharded axes: the pieces' norms, squared and summed in
  // double with one host sync per set.
  std::map<uint8_t, std::vector<at::Tensor>> norms;
  for (size_t i = 0; i < piece_norms.size(); ++i) {
    if (!piece_norms[i].defined()) continue;
    const Placement& placement = placements[i];
    if (!placement.is_canonical_replica(coords, varying)) continue;
    norms[(placement.sharded() | varying).bits()].push_back(piece_norms[i]);
  }
  std::map<uint8_t, double> sums;
  for (const auto& [bits, list] : norms) {
    sums[bits] = torch::stack(list).to(torch::kDouble).pow(2).sum().item<double>();
  }
  // Every rank must reduce the same sets in the same order: the sets any
  // rank holds, agreed by a max over one flag per set (no communication
  // when every piece is replicated, the common case).
  at::Tensor flags = torch::zeros({kAxisSets}, torch::kInt64);
  for (const auto& [bits, sum] : sums) flags[bits] = 1;
  bool any_sharded = false;
  for (const auto& [bits, sum] : sums) any_sharded |= bits != 0;
  at::Tensor any = torch::tensor({static_cast<int64_t>(any_sharded)}, torch::kInt64);
  mesh.world()->all_reduce(any, comm::ReduceOp::kMax)->wait();
  if (any.item<int64_t>() == 0) return std::sqrt(sums.count(0) ? sums[0] : 0.0);
  mesh.world()->all_reduce(flags, comm::ReduceOp::kMax)->wait();
  double total = 0.0;
  for (int b = 0; b < kAxisSets; ++b) {
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

bool GradientStrategy::gradients_finite(const std::vector<GradPiece>& pieces) {
  for (const auto& piece : pieces) {
    if (piece.grad.defined() && !torch::isfinite(piece.grad).all().item<bool>()) return false;
  }
  return true;
}

double GradientStrategy::gradient_norm(const std::vector<GradPiece>& pieces,
                                       const DeviceMesh& mesh) {
  return global_grad_norm(pieces, mesh);
}

void GradientStrategy::scale_gradients(std::vector<GradPiece>& pieces, double factor) {
  torch::NoGradGuard no_grad;
  for (auto& piece : pieces) {
    if (piece.grad.defined()) piece.grad.mul_(factor);
  }
}

at::Tensor GradientStrategy::master_of(const at::Tensor& param) {
  AdamW* optimizer = adamw();
  return optimizer != nullptr ? optimizer->master_of(param) : at::Tensor();
}

std::vector<PlacedParameter> GradientStrategy::parameters_at_rest() {
  KOLOS_CHECK(model_ != nullptr, "gradients plugin `", name(), "` did not record its model");
  return model_->placed_parameters();
}

bool reduce_in_fp32(const RunConfig& config) {
  return config.train.reduce_dtype == "fp32" && config.train.precision != "fp32";
}

AdamWSettings adamw_settings(const OptimConfig& config) {
  KOLOS_CHECK_KIND(kConfig, config.name == "adamw", "optim.name: unknown optimizer `",
                   config.name, "`; available: adamw");
  return AdamWSettings{config.lr,  config.beta1,        config.beta2,
                       config.eps, config.weight_decay, config.fused};
}

}  // namespace kolos
