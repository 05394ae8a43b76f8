// The Ulysses all-to-alls (all_to_all.h).
#include "all_to_all.h"

#include <torch/torch.h>

#include "kolos/core/comm/process_group.h"

namespace kolos {
namespace {

using comm::ProcessGroup;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor sequence_to_heads(const at::Tensor& x, ProcessGroup& group) {
  const int64_t n = group.size();
  const int64_t N = x.size(0), H = x.size(1), t = x.size(2), d = x.size(3);
  // Row r of the send buffer: head block r, for rank r.
  at::Tensor send = x.reshape({N, n, H / n, t, d}).permute({1, 0, 2, 3, 4}).contiguous();
  at::Tensor recv = torch::empty_like(send);
  group.all_to_all(recv, send)->wait();
  // Row s of what arrived: this rank's head block of sequence chunk s.
  return recv.permute({1, 2, 0, 3, 4}).reshape({N, H / n, n * t, d});
}

at::Tensor heads_to_sequence(const at::Tensor& y, ProcessGroup& group) {
  const int64_t n = group.size();
  const int64_t N = y.size(0), h = y.size(1), T = y.size(2), d = y.size(3);
  // Row s of the send buffer: sequence chunk s, for rank s.
  at::Tensor send = y.reshape({N, h, n, T / n, d}).permute({2, 0, 1, 3, 4}).contiguous();
  at::Tensor recv = torch::empty_like(send);
  group.all_to_all(recv, send)->wait();
  // Row r of what arrived: head block r of this rank's chunk.
  return recv.permute({1, 0, 2, 3, 4}).reshape({N, n * h, T / n, d});
}

// The group travels through the autograd context as an address: groups
// belong to the mesh or the plugin, which outlive every graph built on them.
ProcessGroup& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
}

struct SequenceToHeads : torch::autograd::Function<SequenceToHeads> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return sequence_to_heads(x, *reinterpret_cast<ProcessGroup*>(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {heads_to_sequence(grad[0], group_of(ctx)), at::Tensor()};
  }
};

struct HeadsToSequence : torch::autograd::Function<HeadsToSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, int64_t group) {
    ctx->saved_data["group"] = group;
    return heads_to_sequence(y, *reinterpret_cast<ProcessGroup*>(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {sequence_to_heads(grad[0], group_of(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all_sequence_to_heads(const at::Tensor& x, comm::ProcessGroup& group) {
  return SequenceToHeads::apply(x, reinterpret_cast<int64_t>(&group));
}

at::Tensor all_to_all_heads_to_sequence(const at::Tensor& y, comm::ProcessGroup& group) {
  return HeadsToSequence::apply(y, reinterpret_cast<int64_t>(&group));
}

}  // namespace kolos
