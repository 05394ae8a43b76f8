// BlockwiseZero: ZeRO stage 3 (plugin zero3).
//
// Parameters are sharded at rest: the model's tensors keep their shape but
// their storage is freed (FSDP's way, so that every view and every tensor
// autograd saved sees the data again when it is re-allocated). One shard
// group per model block. A block's parameters are all-gathered just before
// its forward and before its backward (a hook on the block's output), the
// next block's gather is issued while the current one computes (prefetch
// of one), and a block's storage is freed after its forward
// (parallel.zero.reshard_after_forward) and once all its gradients are in.
// The model is built into place: as each block is built, this rank keeps
// its rows of the block's parameters and frees the rest, so a rank never
// holds more than one whole block (placement_at_build).
//
// Gradients: as each parameter's gradient is final for the micro-batch
// (its grad accumulator's post-hook) it is copied into its block's
// rank-major staging buffer and .grad is dropped; a block whose gradients
// are all in is reduce-scattered (average) on the communication thread and
// added into the sharded gradient, on every micro-batch. Reductions are
// launched strictly from the last block to the first, gathers from the
// block hooks in model order, so every rank enqueues the same collectives
// in the same order (as FSDP, relying on autograd visiting the same graph
// in the same order on every rank).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "kolos/core/grad_hooks.h"  // GradAccumulatorPtr
#include "zero.h"

namespace kolos::zero {

class BlockwiseZero : public ZeroStrategy {
 public:
  BlockwiseZero() : ZeroStrategy(3) {}
  ~BlockwiseZero() override;

  // [parallel.zero]: reshard_after_forward, besides the core's stage.
  void configure(const PluginContext& context) override;
  BlockBuilt placement_at_build(const DeviceMesh& mesh) override;
  void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) override;
  void zero_grad() override;
  void prepare_backward(bool sync) override;
  void finish_backward() override;
  void step(double lr) override;
  MemoryStats memory() const override;
  GatherStats gather_stats() const override { return gather_stats_; }
  std::vector<PlacedParameter> parameters_at_rest() override;

 private:
  enum class GatherState { kFree, kGathering, kGathered };
  struct Block {         // per shard group (one per model block)
    size_t pending = 0;  // slots whose gradient this micro-batch has not produced yet
    at::Tensor staging;  // [N * S] rank-major, this micro-batch
    GatherState state = GatherState::kFree;
    at::Tensor gather_out;
    comm::WorkPtr gather_work;
  };
  struct Reduction {  // a launched reduction, completed in order
    size_t group;
    at::Tensor input, output;
    comm::WorkPtr work;
  };

  void on_grad_ready(size_t slot);
  void launch_ready(bool force);
  void complete_oldest();
  void close_micro_batch();
  void find_block_uses(const RunConfig& config);
  void install_block_hooks();
  void before_forward(size_t block);
  void after_forward(size_t block, const at::Tensor& output);
  void before_backward(size_t block);
  // `ahead`: for the block after the one about to compute (prefetch).
  void start_gather(size_t group, bool ahead = false);
  void finish_gather(size_t group);
  void free_group(size_t group);
  void free_all_groups();

  // Memory of gathers and reductions, kept for the next one of the same
  // size rather than handed back to malloc. A step gathers every block
  // twice and stages its gradients once, buffers of up to tens of MiB
  // freed in another order than they were taken, which fragments glibc's
  // heap (FSDP leaves this to the CUDA caching allocator; zero.md has the
  // peaks with and without). It keeps at most four rank-major buffers of
  // the largest group (set-up sizes it), and host memory only: on a GPU the
  // caching allocator reuses device memory, knowing which streams use it.
  struct Reuse {
    std::map<size_t, std::vector<at::DataPtr>> free;  // by bytes
    int64_t kept = 0, limit = 0;                      // bytes
    at::DataPtr take(size_t bytes, c10::Allocator* allocator);
    void give(size_t bytes, at::DataPtr data);
  };
  // A parameter's storage from / back to reuse_ (as allocate_storage and
  // free_storage, tensor_storage.h).
  void allocate_reused(const at::Tensor& t);
  void free_reused(const at::Tensor& t);
  // A flat buffer of `numel` elements (uninitialised) from reuse_, and back.
  at::Tensor take_buffer(int64_t numel, const at::TensorOptions& options);
  void give_buffer(at::Tensor& t);

  Reuse reuse_;
  bool reshard_after_forward_ = true;
  std::vector<Block> blocks_;
  size_t next_launch_ = 0;  // groups launch last to first: group size-1-next_launch_
  std::deque<Reduction> in_flight_;
  std::vector<GradAccumulatorPtr> accumulators_;
  bool backward_open_ = false;
  bool reduce_in_fp32_ = false;            // train.reduce_dtype = "fp32" under bf16/fp16
  std::vector<std::vector<size_t>> uses_;  // groups each block reads

  // Bytes held now and the most held at once since zero_grad().
  int64_t gathered_now_ = 0, gathered_peak_ = 0;  // whole parameters + gather buffers
  int64_t staging_now_ = 0, staging_peak_ = 0;    // unsharded gradient buffers
  GatherStats gather_stats_;                      // since zero_grad()
};

}  // namespace kolos::zero
