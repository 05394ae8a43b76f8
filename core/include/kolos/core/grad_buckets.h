// GradBuckets: the gradient-bucket engine that the gradients plugins share
// (dp and zero1 all-reduce whole gradients, zero2 reduce-scatters them into
// shards), as Megatron's param_and_grad_buffer serves both DDP and the
// distributed optimizer.
//
// Protocol, per optimizer step (the GradientStrategy calls of the same name):
//   zero_grad()              zero the gradients; rebuild the buckets once,
//                            in the agreed ready order (see below)
//   for each micro-batch:
//     prepare_backward(sync) open a backward
//     backward               a post-hook on each parameter's gradient
//                            accumulator (grad_hooks.h) marks it ready; a
//                            bucket whose parameters are all ready is
//                            launched at once if every earlier bucket was
//   finish_backward()        launch what is left, wait for every reduction
//
// Buckets are launched strictly in index order, so every rank of the group
// enqueues the same collectives in the same order even when hooks fire in a
// different order on different ranks. Buckets hold about `bucket_bytes`
// each (the first at most `first_bucket_bytes`, so communication starts
// early) and one dtype.
//
// Bucket order. At construction the buckets follow reversed parameter
// order (a guess at the order backward produces gradients). During the
// first step the engine records the order in which gradients become ready
// (the first time each hook fires); at the end of that step's
// finish_backward() the group agrees on rank 0's recorded order (a
// broadcast: ranks may observe different orders) and the next zero_grad()
// rebuilds the buckets in it, parameters that never became ready last, in
// reversed parameter order. This is what PyTorch DDP's reducer does after
// its first iteration: a tied weight whose gradient is final only at the
// end of backward (GPT's token embedding, read by the head) no longer holds
// back the parameters bucketed with it.
//
// Reductions:
// - kAllReduce: every parameter's .grad is a tensor over its bucket's flat
//   buffer, so autograd sums micro-batches in place; only the step's last
//   micro-batch (sync) reduces: all_reduce(average) of each bucket. A
//   rebuild re-points the same .grad tensors (TensorImpl::set_) at the new
//   buffers, so references that a caller holds (an optimizer slot) stay valid.
// - kReduceScatter: every micro-batch reduces (no whole gradient is kept).
//   When a gradient is ready it is copied into its bucket's rank-major
//   staging buffer [N][S] (row r holds rows [r·chunk, (r+1)·chunk) of every
//   parameter of the bucket, chunk = ceil(dim0 / N), padding zero) and .grad
//   is dropped; a launched bucket is reduce_scatter(average)ed and, when it
//   completes, each parameter's part of the result is added into the
//   `shard_grad` the caller gave. At most one reduction is in flight besides
//   the bucket being filled, which bounds the staging a rank holds.
//
// Thread safety: none; every call, hooks included, runs on the thread that
// runs backward. Collectives run on the group's communication thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolos/core/comm/hierarchical.h"
#include "kolos/core/comm/process_group.h"
#include "kolos/core/gradient_strategy.h"

namespace kolos {

class GradBuckets {
 public:
  enum class Reduction { kAllReduce, kReduceScatter };

  struct Param {
    std::string name;
    at::Tensor tensor;      // a leaf that requires grad
    at::Tensor shard_grad;  // kReduceScatter: this rank's [ceil(dim0 / N), ...] gradient
  };

  struct Options {
    Reduction reduction = Reduction::kAllReduce;
    int64_t bucket_bytes = int64_t{25} << 20;
    int64_t first_bucket_bytes = int64_t{1} << 20;
    // Record the ready order on the first step and rebuild in it.
    bool rebuild_in_ready_order = true;
    // Reduce bf16/fp16 gradients in fp32 (train.reduce_dtype = "fp32"): each
    // bucket is widened for the collective and the result rounded back once,
    // instead of rounding at every addition of the reduction.
    bool reduce_in_fp32 = false;
    // kAllReduce: how buckets are all-reduced when the group spans nodes
    // ([parallel] allreduce; kolos/core/comm/hierarchical.h). The choice is
    // made in the constructor, on a sample of the largest bucket.
    comm::AllReduceMode allreduce = comm::AllReduceMode::kFlat;
  };

  // Installs the gradient hooks (and, for kAllReduce, points every .grad at
  // its bucket). `group`: the ranks that reduce together. Collective over
  // `group` for kAllReduce unless options.allreduce is kFlat (it learns the
  // ranks' nodes, and "auto" times both paths); every rank of the group
  // constructs it at the same point of its collectives.
  GradBuckets(std::vector<Param> params, comm::ProcessGroupPtr group, Options options);
  // Waits for reductions still in flight (an exception mid-step); never throws.
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  void zero_grad();
  void prepare_backward(bool sync);
  // Collective over the group on the first step (agreeing on the order).
  void finish_backward();

  // This step's reduction figures (see ReductionStats); zeros before the
  // first finish_backward(), except the all-reduce path, set from the start.
  ReductionStats stats() const;
  // kAllReduce: the path chosen and why (path "flat", one node, for kReduceScatter).
  const comm::AllReduceChoice& all_reduce_choice() const;

  // The buckets in launch order, each as its parameters' names in the
  // bucket's layout (tests, diagnostics).
  std::vector<std::vector<std::string>> buckets() const;
  // True once the buckets were rebuilt in the recorded ready order.
  bool rebuilt() const;
  // Bytes of the whole-gradient buffers (kAllReduce) and the most bytes of
  // staging held at once since the last zero_grad() (kReduceScatter).
  int64_t gradient_bytes() const;
  int64_t staging_peak_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolos
