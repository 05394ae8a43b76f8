#include <torch/torch.h>

#include "kolos/core/error.h"
#include "kolos/core/placement.h"

namespace kolos {

at::Tensor gather_global(const at::Tensor& local, const Placement& placement,
                         const DeviceMesh& mesh) {
  return gather_global(local, placement, mesh, placement.sharded());
}

at::Tensor gather_global(const at::Tensor& local, const Placement& placement,
                         const DeviceMesh& mesh, AxisSet axes) {
  KOLOS_CHECK(local.sizes().vec() == placement.local_shape(), "local tensor of shape ",
              local.sizes(), " does not match its placement ", placement.to_string());
  // The real piece, without padding.
  at::Tensor piece = local;
  for (int d = 0; d < placement.dim(); ++d) piece = piece.narrow(d, 0, placement.slice(d).length);
  if (placement.is_full()) return piece.clone();
  KOLOS_CHECK(!axes.empty(), "placement ", placement.to_string(),
              " is a part of its tensor but names no axis to gather over");
  const auto& group = mesh.group(axes);
  const int n = group->size();
  const int dims = placement.dim();

  // Everyone's slice: (offset, length) per dimension.
  at::Tensor mine = torch::empty({2 * dims}, torch::kInt64);
  for (int d = 0; d < dims; ++d) {
    mine[2 * d] = placement.slice(d).offset;
    mine[2 * d + 1] = placement.slice(d).length;
  }
  at::Tensor all = torch::empty({n * 2 * dims}, torch::kInt64);
  group->all_gather_flat(all, mine)->wait();

  std::vector<at::Tensor> pieces;
  for (int r = 0; r < n; ++r) {
    std::vector<int64_t> shape;
    for (int d = 0; d < dims; ++d) shape.push_back(all[r * 2 * dims + 2 * d + 1].item<int64_t>());
    pieces.push_back(torch::empty(shape, local.options()));
  }
  at::Tensor flat = piece.contiguous();
  group->all_gather(pieces, flat)->wait();

  at::Tensor global = torch::zeros(placement.global_shape(), local.options());
  for (int r = 0; r < n; ++r) {
    at::Tensor target = global;
    for (int d = 0; d < dims; ++d) {
      target = target.narrow(d, all[r * 2 * dims + 2 * d].item<int64_t>(),
                             all[r * 2 * dims + 2 * d + 1].item<int64_t>());
    }
    target.copy_(pieces[r]);
  }
  return global;
}

}  // namespace kolos
