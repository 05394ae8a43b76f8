// BucketedZero: ZeRO stages 1 and 2 (plugins zero1, zero2).
//
// The parameters stay whole; the optimizer steps this rank's shard of each
// (a working copy refreshed from the whole parameters at zero_grad()), and
// after the step the shards are all-gathered back into the whole
// parameters, a shard group at a time. In fp32 the whole parameters are the
// truth at rest (a checkpoint holds and loads them); under bf16/fp16 the
// fp32 masters are, and they exist only for this rank's shard, so a
// checkpoint holds the shards (the engine saves their masters) and a load
// all-gathers the shards back into the whole parameters (after_load).
//
// Gradients go through the core's bucket engine (GradBuckets), in buckets
// of about parallel.bucket_mb filled in the order gradients become ready:
//   stage 1  all-reduce mode: whole gradients (.grad over the buckets,
//            summed in place over micro-batches), all-reduced (average) on
//            the last micro-batch as backward fills each bucket; then each
//            rank copies its rows into its gradient shard.
//   stage 2  reduce-scatter mode: on every micro-batch each gradient is
//            copied rank-major into its bucket's staging and dropped; a full
//            bucket is reduce-scattered (average) and added into the shards.
//            No whole gradient outlives its micro-batch.
// The shard groups (the flat buffers the optimizer and the all-gather use)
// are fixed at set-up; the reduction buckets are the engine's and may be
// rebuilt, which is why the two are separate.
#pragma once

#include <memory>

#include "kolos/core/grad_buckets.h"
#include "zero.h"

namespace kolos::zero {

class BucketedZero : public ZeroStrategy {
 public:
  explicit BucketedZero(int stage);  // 1 or 2

  void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) override;
  void zero_grad() override;
  void prepare_backward(bool sync) override;
  void finish_backward() override;
  void step(double lr) override;
  MemoryStats memory() const override;
  ReductionStats reduction_stats() const override;
  std::vector<PlacedParameter> parameters_at_rest() override;
  void after_load() override;

 private:
  void copy_grad_shards_from_whole();
  void refresh_masters();
  void gather_params_after_step();

  const bool whole_grads_;  // stage 1
  // One bucket engine per domain (domains_[d]'s group), in domain order.
  std::vector<std::unique_ptr<GradBuckets>> buckets_;
  // The all-gather buffers after the step, at their high-water mark.
  int64_t gathered_now_ = 0, gathered_peak_ = 0;
};

}  // namespace kolos::zero
