#include "tp_ops.h"

#include <torch/torch.h>

#include <cmath>

namespace kolos::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through the autograd context as an address: groups
// belong to the mesh, which outlives every graph built on it.
int64_t handle(ProcessGroup& group) { return reinterpret_cast<int64_t>(&group); }
ProcessGroup& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
}

at::Tensor all_reduced(const at::Tensor& x, ProcessGroup& group, comm::ReduceOp op) {
  at::Tensor out = x.clone(at::MemoryFormat::Contiguous);
  group.all_reduce(out, op)->wait();
  return out;
}

at::Tensor all_gathered(const at::Tensor& x, ProcessGroup& group, int64_t dim) {
  at::Tensor rows = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = rows.sizes().vec();
  shape[0] *= group.size();
  at::Tensor out = torch::empty(shape, rows.options());
  group.all_gather_flat(out, rows)->wait();
  // Contiguous in the caller's layout: the column layers that read one
  // gathered input (q, k and v) then save that one tensor for their
  // backward, where a strided view would have each save its own copy.
  return dim == 0 ? out : out.movedim(0, dim).contiguous();
}

at::Tensor reduce_scattered(const at::Tensor& x, ProcessGroup& group, int64_t dim) {
  at::Tensor rows = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = rows.sizes().vec();
  TORCH_CHECK(shape[0] % group.size() == 0, "reduce-scatter over ", group.name(),
              ": extent ", shape[0], " does not divide into ", group.size(), " parts");
  shape[0] /= group.size();
  at::Tensor out = torch::empty(shape, rows.options());
  group.reduce_scatter_flat(out, rows, comm::ReduceOp::kSum)->wait();
  return out.movedim(0, dim);
}

// This rank's chunk of x along dim (x.size(dim) divides by the group size).
at::Tensor chunk_of(const at::Tensor& x, ProcessGroup& group, int64_t dim) {
  TORCH_CHECK(x.size(dim) % group.size() == 0, "split over ", group.name(), ": extent ",
              x.size(dim), " does not divide into ", group.size(), " parts");
  const int64_t n = x.size(dim) / group.size();
  return x.narrow(dim, group.rank() * n, n).contiguous();
}

struct CopyIn : torch::autograd::Function<CopyIn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t g) {
    ctx->saved_data["group"] = g;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_reduced(grad[0], group_of(ctx), comm::ReduceOp::kSum), at::Tensor()};
  }
};

struct ReduceOut : torch::autograd::Function<ReduceOut> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, int64_t g) {
    return all_reduced(x, *reinterpret_cast<ProcessGroup*>(g), comm::ReduceOp::kSum);
  }
  static variable_list backward(AutogradContext*, variable_list grad) {
    return {grad[0], at::Tensor()};
  }
};

struct AllReduce2 : torch::autograd::Function<AllReduce2> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t g) {
    ctx->saved_data["group"] = g;
    return all_reduced(x, *reinterpret_cast<ProcessGroup*>(g), comm::ReduceOp::kSum);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_reduced(grad[0], group_of(ctx), comm::ReduceOp::kSum), at::Tensor()};
  }
};

struct Gather : torch::autograd::Function<Gather> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t g, int64_t dim) {
    ctx->saved_data["group"] = g;
    ctx->saved_data["dim"] = dim;
    return all_gathered(x, *reinterpret_cast<ProcessGroup*>(g), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {reduce_scattered(grad[0], group_of(ctx), ctx->saved_data["dim"].toInt()),
            at::Tensor(), at::Tensor()};
  }
};

struct ScatterSum : torch::autograd::Function<ScatterSum> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t g, int64_t dim) {
    ctx->saved_data["group"] = g;
    ctx->saved_data["dim"] = dim;
    return reduce_scattered(x, *reinterpret_cast<ProcessGroup*>(g), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_gathered(grad[0], group_of(ctx), ctx->saved_data["dim"].toInt()), at::Tensor(),
            at::Tensor()};
  }
};

// A value whole and equal on every rank, of which each keeps its chunk:
// every rank's upstream work is whole, so each needs the whole gradient.
struct Split : torch::autograd::Function<Split> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t g, int64_t dim) {
    ctx->saved_data["group"] = g;
    ctx->saved_data["dim"] = dim;
    return chunk_of(x, *reinterpret_cast<ProcessGroup*>(g), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_gathered(grad[0], group_of(ctx), ctx->saved_data["dim"].toInt()), at::Tensor(),
            at::Tensor()};
  }
};

// Every rank's chunk gathered whole, for work every rank then does alike:
// the gradient is equal on every rank, and each keeps its chunk of it.
struct GatherReplicated : torch::autograd::Function<GatherReplicated> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t g, int64_t dim) {
    ctx->saved_data["group"] = g;
    ctx->saved_data["dim"] = dim;
    return all_gathered(x, *reinterpret_cast<ProcessGroup*>(g), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {chunk_of(grad[0], group_of(ctx), ctx->saved_data["dim"].toInt()), at::Tensor(),
            at::Tensor()};
  }
};

// The mean is one value held by every rank, and every rank seeds the same
// gradient for it: each rank's term gets that gradient over n.
struct Average : torch::autograd::Function<Average> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t g) {
    auto& group = *reinterpret_cast<ProcessGroup*>(g);
    ctx->saved_data["n"] = static_cast<int64_t>(group.size());
    return all_reduced(x, group, comm::ReduceOp::kAvg);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {grad[0] / static_cast<double>(ctx->saved_data["n"].toInt()), at::Tensor()};
  }
};

int64_t normalised(int64_t dim, const at::Tensor& x) { return dim < 0 ? dim + x.dim() : dim; }

}  // namespace

at::Tensor copy_in(const at::Tensor& x, ProcessGroup& group) {
  return group.size() == 1 ? x : CopyIn::apply(x, handle(group));
}
at::Tensor reduce_out(const at::Tensor& x, ProcessGroup& group) {
  return group.size() == 1 ? x : ReduceOut::apply(x, handle(group));
}
at::Tensor all_reduce_2(const at::Tensor& x, ProcessGroup& group) {
  return group.size() == 1 ? x : AllReduce2::apply(x, handle(group));
}
at::Tensor gather(const at::Tensor& x, ProcessGroup& group, int64_t dim) {
  return group.size() == 1 ? x : Gather::apply(x, handle(group), normalised(dim, x));
}
at::Tensor scatter_sum(const at::Tensor& x, ProcessGroup& group, int64_t dim) {
  return group.size() == 1 ? x : ScatterSum::apply(x, handle(group), normalised(dim, x));
}
at::Tensor split(const at::Tensor& x, ProcessGroup& group, int64_t dim) {
  return group.size() == 1 ? x : Split::apply(x, handle(group), normalised(dim, x));
}
at::Tensor gather_replicated(const at::Tensor& x, ProcessGroup& group, int64_t dim) {
  return group.size() == 1 ? x : GatherReplicated::apply(x, handle(group), normalised(dim, x));
}
at::Tensor average(const at::Tensor& x, ProcessGroup& group) {
  return group.size() == 1 ? x : Average::apply(x, handle(group));
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& low_logits, const at::Tensor& targets,
                                        int64_t vocab_offset, ProcessGroup& group) {
  // In fp32 whatever the precision (bf16/fp16 logits widened), as the
  // serial loss is.
  const at::Tensor logits = low_logits.to(at::kFloat);
  const int64_t local = logits.size(1);
  // log(sum_v exp(l_v)) = m + log(sum_v exp(l_v - m)), m the global row max
  // (a constant for autograd: the result does not depend on it).
  // A rank may hold no column (fewer classes than vocabulary slices: 5
  // classes in chunks of 2 over 4 ranks leave the last one none).
  at::Tensor row_max;
  {
    torch::NoGradGuard no_grad;
    row_max = local > 0 ? std::get<0>(logits.max(1, /*keepdim=*/true))
                        : torch::full({logits.size(0), 1}, -INFINITY, logits.options());
    if (group.size() > 1) group.all_reduce(row_max, comm::ReduceOp::kMax)->wait();
  }
  at::Tensor shifted = logits - row_max;
  at::Tensor sum_exp = reduce_out(shifted.exp().sum(1), group);
  at::Tensor ids = targets - vocab_offset;
  at::Tensor mine = (ids >= 0).logical_and(ids < local);
  at::Tensor index = ids.masked_fill(mine.logical_not(), 0).unsqueeze(1);
  at::Tensor picked =
      local > 0 ? shifted.gather(1, index).squeeze(1).masked_fill(mine.logical_not(), 0.0)
                : torch::zeros({logits.size(0)}, logits.options());
  at::Tensor target_logit = reduce_out(picked, group);
  return (sum_exp.log() - target_logit).mean();
}

at::Tensor gather_vocabulary(const at::Tensor& logits, int64_t vocab, ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  const int64_t chunk = (vocab + group.size() - 1) / group.size();
  at::Tensor mine = logits;
  if (mine.size(-1) < chunk) {  // a last chunk short of the padding
    std::vector<int64_t> pad = mine.sizes().vec();
    pad.back() = chunk - mine.size(-1);
    mine = torch::cat({mine, torch::zeros(pad, mine.options())}, -1);
  }
  return all_gathered(mine, group, mine.dim() - 1).narrow(-1, 0, vocab);
}

at::Tensor masked_embedding(const at::Tensor& weight, const at::Tensor& ids, int64_t offset,
                            int64_t length) {
  at::Tensor local = ids - offset;
  at::Tensor outside = (local < 0).logical_or(local >= length);
  at::Tensor rows = torch::embedding(weight, local.masked_fill(outside, 0));
  return rows.masked_fill(outside.unsqueeze(-1), 0.0);
}

}  // namespace kolos::tp
