// Differentiable collectives for tensor parallelism, and the
// vocabulary-parallel cross entropy built from them.
//
// Each op names its forward and its backward communication. Which one a
// layer needs follows from how the ranks of the group use the result:
//
//   copy_in        forward: identity      backward: all-reduce (sum)
//   reduce_out     forward: all-reduce    backward: identity
//   all_reduce_2   forward: all-reduce    backward: all-reduce
//   gather         forward: all-gather    backward: reduce-scatter (sum)
//   scatter_sum    forward: reduce-scatter (sum)   backward: all-gather
//   average        forward: mean          backward: gradient / n (no traffic)
//   split          forward: keep my chunk backward: all-gather
//   gather_replicated  forward: all-gather  backward: keep my chunk
//
// reduce_out's identity backward is right when every rank of the group goes
// on to compute the same thing from the reduced value (Megatron's row
// layer); all_reduce_2 when each rank uses it differently (a norm's
// statistics used on different feature slices). Groups of one rank make
// every op the identity. Tensors keep their dtype; collectives run on the
// group's communication thread and are waited for.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kolos/core/comm/process_group.h"

namespace kolos::tp {

using comm::ProcessGroup;

at::Tensor copy_in(const at::Tensor& x, ProcessGroup& group);
at::Tensor reduce_out(const at::Tensor& x, ProcessGroup& group);
at::Tensor all_reduce_2(const at::Tensor& x, ProcessGroup& group);
// Concatenation of every rank's `x` along `dim`, in group order.
at::Tensor gather(const at::Tensor& x, ProcessGroup& group, int64_t dim);
// Sum over the group of `x`, cut along `dim` into group-size chunks; rank r
// keeps chunk r. x.size(dim) must divide by the group size.
at::Tensor scatter_sum(const at::Tensor& x, ProcessGroup& group, int64_t dim);
at::Tensor average(const at::Tensor& x, ProcessGroup& group);
// This rank's chunk along `dim` of an `x` that is whole and equal on every
// rank (its backward gathers the chunks' gradients), and the inverse: the
// chunks gathered whole for work every rank does alike (its backward keeps
// this rank's chunk of the gradient, equal on every rank).
at::Tensor split(const at::Tensor& x, ProcessGroup& group, int64_t dim);
at::Tensor gather_replicated(const at::Tensor& x, ProcessGroup& group, int64_t dim);

// Mean cross entropy of rows of logits split by vocabulary over `group`:
// `logits` [N, V_local] holds columns [vocab_offset, vocab_offset + V_local)
// of the global logits, `targets` [N] are global ids. Every rank of the
// group returns the same loss; no rank holds the full logits.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        int64_t vocab_offset, ProcessGroup& group);

// The whole logits [.., vocab] from each rank's vocabulary slice, cut as
// the embedding tables are (chunks of ceil(vocab / size), the last short);
// no gradient.
at::Tensor gather_vocabulary(const at::Tensor& logits, int64_t vocab, ProcessGroup& group);

// The rows of an embedding piece holding ids [offset, offset + length):
// lookups of `ids` with ids outside the piece giving zeros.
at::Tensor masked_embedding(const at::Tensor& weight, const at::Tensor& ids, int64_t offset,
                            int64_t length);

}  // namespace kolos::tp
