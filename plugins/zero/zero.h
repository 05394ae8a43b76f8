// ZeRO for the "gradients" role: what the three stages share.
//
// Every trainable parameter is cut along dim 0 into N = |dp x sp| chunks of
// ceil(rows / N) rows, the last ones padded with zeros (FSDP2's rule, the
// same as Placement::shard), and this rank owns chunk r = its index in the
// dp x sp group. The shards are kept in groups (one flat buffer of S
// elements per group for the parameters' shards and one for their
// gradients) so that one collective serves a group: all_gather_flat of a
// group's S gives a rank-major [N][S] buffer whose row r holds chunk r of
// every parameter of the group (gather_rows), and scatter_rows builds the
// same layout from whole tensors for reduce_scatter_flat.
//
// Under expert parallelism (an ep axis) the experts, held apart along ep,
// are sharded and reduced over dp x sp only, the rest over dp x ep x sp:
// each parameter belongs to the domain of the data axes it is not held
// apart along (Domain), and a shard group holds one domain's parameters.
// An expert's gradient is then divided by the ep size (see the dp plugin).
//
// Two implementations:
//   BucketedZero (bucketed_zero.h)   stages 1 and 2: whole parameters, the
//                                    gradients reduced by the core's bucket
//                                    engine (GradBuckets), shards all-gathered
//                                    back into the whole parameters after the step
//   BlockwiseZero (blockwise_zero.h) stage 3: parameters sharded at rest,
//                                    gathered and reduced block by block
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/data_domains.h"
#include "kolos/core/gradient_strategy.h"
#include "kolos/core/optimizer.h"

namespace kolos::zero {

class ZeroStrategy : public GradientStrategy {
 public:
  explicit ZeroStrategy(int stage) : stage_(stage) {}

  std::string name() const override { return "zero" + std::to_string(stage_); }
  std::vector<GradPiece> grad_pieces() override;
  std::vector<StatePiece> optimizer_state() override;
  int64_t optimizer_steps() const override;
  void set_optimizer_steps(int64_t steps) override;
  AdamW* adamw() override { return optimizer_.get(); }

 protected:
  struct Slot {
    PlacedParameter param;  // the model's tensor (stage 3: storage freed at rest)
    Placement shard;        // this rank's piece: param.placement sharded on dim 0
    int64_t rows = 0;       // local extent of dim 0
    int64_t row_numel = 1;  // elements per row
    int64_t chunk = 0;      // rows per shard, ceil(rows / N)
    size_t group = 0;
    size_t domain = 0;      // domains_[domain]: the ranks it is sharded over
    int64_t offset = 0;     // into the group's flat shard
    at::Tensor master;      // this rank's shard, [chunk, ...]; a view of group.shard_params
    at::Tensor grad_shard;  // a view of group.shard_grads
    int64_t rows_of(int64_t r) const;  // real rows of rank r's chunk
    int64_t shard_numel() const { return chunk * row_numel; }
    int64_t bytes() const;
  };
  // The ranks a parameter is sharded and its gradient averaged over.
  // The ranks a gradient is averaged over (kolos/core/data_domains.h).
  using Domain = DataDomain;
  struct ShardGroup {
    size_t domain = 0;
    std::vector<size_t> slots;
    int64_t shard_numel = 0;  // S
    at::Tensor shard_params;  // [S]
    at::Tensor shard_grads;   // [S]
  };

  // The model's trainable parameters as slots (others kept whole in
  // frozen_), the dp x sp group, and a warning when it has one rank.
  void shard_parameters(Model& model, const DeviceMesh& mesh);
  // Building into place (GradientStrategy::placement_at_build): this
  // rank's rows of each trainable parameter of a block just built are kept
  // (built_rows_) and the parameter's memory freed.
  void keep_built_rows(const std::vector<PlacedParameter>& parameters, const DeviceMesh& mesh);
  // Groups of slots, each of one domain; each slot's master (copied from
  // the whole parameter, or from its rows kept while built) and grad_shard
  // become views of its group's flat buffers.
  void build_groups(const std::vector<std::vector<size_t>>& members);
  // AdamW over every slot's master and grad_shard.
  void make_optimizer(const RunConfig& config);
  // Whole tensor <-> rank-major [N][S] buffer of the slot's group.
  void scatter_rows(const Slot& s, const at::Tensor& whole, const at::Tensor& rank_major) const;
  void gather_rows(const Slot& s, const at::Tensor& rank_major, const at::Tensor& whole) const;
  // Bytes held at rest by the shards and the frozen parameters.
  MemoryStats shard_memory() const;

  static int64_t bytes_of(const at::Tensor& t);
  // Error unless p's tensor is contiguous over a storage of its own (ZeRO-3
  // frees and refills it).
  void check_owns_storage(const PlacedParameter& p) const;
  static void track(int64_t& current, int64_t& peak, int64_t delta);

  const int stage_;
  // The whole data group (dp x sp, and ep when it has ranks): domains_[0]'s.
  comm::ProcessGroupPtr group_;
  int64_t ranks_ = 1, index_ = 0;
  std::vector<Domain> domains_;
  std::vector<Slot> slots_;
  std::vector<PlacedParameter> frozen_;  // parameters without gradients: whole, untouched
  std::vector<ShardGroup> groups_;
  std::unique_ptr<AdamW> optimizer_;
  std::unordered_map<const void*, size_t> slot_of_impl_;
  // A parameter's TensorImpl -> this rank's rows of it, kept as the model
  // was built; emptied by build_groups().
  std::unordered_map<const void*, at::Tensor> built_rows_;
};

}  // namespace kolos::zero
