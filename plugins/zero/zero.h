// ZeroStrategy: ZeRO stages 1, 2 and 3 for the "gradients" role.
//
// Every trainable parameter is cut along dim 0 into N = |dp x sp| chunks of
// ceil(rows / N) rows, the last ones padded with zeros (FSDP2's rule, the
// same as Placement::shard), and this rank owns chunk r = its index in the
// dp x sp group. Parameters are grouped (stage 1/2: buckets of about
// parallel.bucket_mb in reverse parameter order, as dp; stage 3: one group
// per model block), and a group's shards are one flat buffer of S elements,
// so that one collective serves a whole group: reduce_scatter_flat takes a
// rank-major [N][S] staging buffer (chunk r of every parameter of the group
// at row r) and leaves this rank's S; all_gather_flat does the reverse.
//
//   stage 1  params whole; grads whole (.grad views into buckets, summed in
//            place over micro-batches); on the last micro-batch each bucket
//            is all-reduced (average) as soon as backward fills it; each rank
//            copies its shard of the reduced gradient, steps its shard of
//            the parameters (AdamW moments sharded), and the shards are
//            all-gathered back into the whole parameters.
//   stage 2  as 1, but no whole gradient is kept: as each parameter's
//            gradient is final for the micro-batch (its grad accumulator's
//            post-hook) it is copied into its bucket's staging buffer and
//            .grad is dropped; a full bucket is reduce-scattered (average)
//            on the communication thread, overlapping the rest of backward,
//            and added into the sharded gradient. This happens on every
//            micro-batch (it is what keeps gradients sharded).
//   stage 3  as 2, and parameters are sharded at rest: the model's tensors
//            keep their shape but their storage is freed (FSDP's way, so
//            that every view and every tensor autograd saved sees the data
//            again when it is re-allocated). A block's parameters are
//            all-gathered just before its forward and before its backward
//            (a hook on the block's output), the next block's gather is
//            issued while the current one computes (prefetch of one), and a
//            block's storage is freed after its forward
//            (parallel.zero.reshard_after_forward) and after its backward.
//
// Collectives are enqueued in the same order on every rank: gathers from
// the block hooks (model order), reductions strictly in group order. Both
// rely on autograd visiting the same graph in the same order on every rank,
// as FSDP does.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/gradients.h"
#include "kolos/core/optimizer.h"

namespace torch::autograd {
struct Node;
}

namespace kolos::zero {

class ZeroStrategy : public GradientStrategy {
 public:
  explicit ZeroStrategy(int stage);
  ~ZeroStrategy() override;

  std::string name() const override { return "zero" + std::to_string(stage_); }
  void configure(const PluginContext& context) override;
  void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) override;
  void zero_grad() override;
  void prepare_backward(bool sync) override;
  void finish_backward() override;
  std::vector<GradPiece> grad_pieces() override;
  void step(double lr) override;
  MemoryStats memory() const override;
  std::vector<PlacedParameter> parameters_at_rest() override;
  std::vector<StatePiece> optimizer_state() override;
  int64_t optimizer_steps() const override;
  void set_optimizer_steps(int64_t steps) override;

 private:
  struct Slot {
    PlacedParameter param;  // the model's tensor (stage 3: storage freed at rest)
    Placement shard;        // this rank's piece: param.placement sharded on dim 0
    int64_t rows = 0;       // local extent of dim 0
    int64_t row_numel = 1;  // elements per row
    int64_t chunk = 0;      // rows per shard, ceil(rows / N)
    size_t group = 0;
    int64_t offset = 0;     // into the group's flat shard
    at::Tensor master;      // this rank's shard, [chunk, ...]; a view of group.shard_params
    at::Tensor grad_shard;  // a view of group.shard_grads
    int64_t rows_of(int64_t r) const;  // real rows of rank r's chunk
    int64_t shard_numel() const { return chunk * row_numel; }
    int64_t bytes() const;
  };
  enum class GatherState { kFree, kGathering, kGathered };
  struct Group {
    std::vector<size_t> slots;
    int64_t shard_numel = 0;  // S
    at::Tensor shard_params;  // [S]
    at::Tensor shard_grads;   // [S]
    at::Tensor full_grads;    // stage 1: the whole gradients (.grad views), summed in place
    size_t pending = 0;       // slots whose gradient this micro-batch has not produced yet
    bool launched = false;
    at::Tensor staging;  // stage 2/3: [N * S] rank-major, this micro-batch
    // stage 3
    GatherState state = GatherState::kFree;
    at::Tensor gather_out;
    comm::WorkPtr gather_work;
  };
  struct Reduction {  // a launched reduction, completed in order
    size_t group;
    at::Tensor input, output;
    comm::WorkPtr work;
  };

  void build_groups(const std::vector<std::vector<size_t>>& members);
  std::vector<std::vector<size_t>> byte_buckets(int64_t bucket_bytes) const;
  void install_grad_hooks();
  void on_grad_ready(size_t slot);
  void launch_ready(bool force);
  void complete_oldest();
  void complete_all();
  void close_micro_batch();
  void copy_grad_shards_from_whole();
  void refresh_masters();
  void gather_params_after_step();
  void scatter_rows(const Slot& s, const at::Tensor& whole, const at::Tensor& rank_major) const;
  void gather_rows(const Slot& s, const at::Tensor& rank_major, const at::Tensor& whole) const;

  // stage 3
  void find_block_uses(const RunConfig& config);
  void install_block_hooks();
  void before_forward(size_t block);
  void after_forward(size_t block, const at::Tensor& output);
  void before_backward(size_t block);
  void start_gather(size_t group);
  void finish_gather(size_t group);
  void free_group(size_t group);
  void free_all_groups();
  void track(int64_t& current, int64_t& peak, int64_t delta);

  const int stage_;
  comm::ProcessGroupPtr group_;
  int64_t ranks_ = 1, index_ = 0;
  bool reshard_after_forward_ = true;
  std::vector<Slot> slots_;
  std::vector<PlacedParameter> frozen_;  // parameters without gradients: whole, untouched
  std::vector<Group> groups_;
  std::vector<size_t> launch_order_;  // groups in the order their reductions launch
  size_t next_launch_ = 0;
  std::deque<Reduction> in_flight_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::unique_ptr<AdamW> optimizer_;
  bool sync_ = true;
  bool backward_open_ = false;
  std::vector<std::vector<size_t>> uses_;  // stage 3: groups each block reads
  std::unordered_map<const void*, size_t> slot_of_impl_;

  // Bytes held now and the most held at once since zero_grad().
  int64_t gathered_now_ = 0, gathered_peak_ = 0;  // stage 3: whole parameters + gather buffers
  int64_t staging_now_ = 0, staging_peak_ = 0;    // stage 2/3: unsharded gradient buffers
};

}  // namespace kolos::zero
