// ChunkedMemory: the memory role's plugin `chunks`. Parameters, gradients
// and AdamW's two moments live in fixed-size chunks; a budgeted compute tier
// holds the chunks the current part of the step needs, host memory or NVMe
// files hold the rest (docs/memory.md).
//
// It serves in the gradients role's place: it keeps the gradients and the
// optimizer states itself. One iteration (optimizer step) is a fixed
// sequence of trace steps, known before training:
//   per micro-batch: forward of block 0 .. B-1 (the parameters each block
//     reads), backward of block B-1 .. 0 (those parameters and their
//     gradients);
//   then per chunk k: the optimizer step of chunk k (its parameters,
//     gradients and moments).
// The placement plan (memory/placement.h) is made from that trace, and the
// executor (memory/chunk_executor.h) carries it out: before a trace step
// begins, its chunks are in the compute tier. The model's parameter tensors
// and their .grad tensors, and the optimizer's moments, keep their identity
// throughout; only the memory under them changes: a tensor's storage points
// into its chunk while the chunk is in a step that needs it, and holds no
// memory otherwise (kolos/core/tensor_storage.h's technique, so views and
// tensors autograd saved follow). Block hooks advance the trace: a block's
// forward begins a forward step, the hook on its output (before its
// backward) a backward step; the optimizer's chunk steps are run by step().
//
// Results are bit-equal to the in-memory run (dp on one rank): autograd
// accumulates into the same .grad values, the gradient norm is the same sum
// of the same per-tensor norms, clipping multiplies the same tensors by the
// same factors, and the optimizer is the same kolos::AdamW applied to one
// chunk's slots at a time (its update is element-wise).
//
// The class, its small accessors and its state; its members are defined in
// chunks.cpp (set-up: the layout of chunks and domains, the trace, the plan,
// the optimizer, the executor, the block hooks), chunk_step.cpp (one
// iteration: the trace's steps, the gradients' reductions and norms, the
// optimizer step over the chunks) and chunk_state.cpp (memory statistics
// and checkpoints' copies of the states).
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/data_domains.h"
#include "kolos/core/gradient_strategy.h"
#include "kolos/core/mesh.h"
#include "kolos/core/optimizer.h"
#include "kolos/memory/chunk_executor.h"
#include "kolos/memory/chunk_layout.h"
#include "kolos/memory/placement.h"

#include "chunk_settings.h"
#include "chunk_spill.h"
#include "chunk_trace.h"

namespace kolos::chunks {

class ChunkedMemory : public GradientStrategy {
 public:
  std::string name() const override { return "chunks"; }

  // ---- set-up (chunks.cpp) ---------------------------------------------------

  void configure(const PluginContext& context) override;
  // Builds the model into place: each block's trainable parameters go to
  // an unnamed file (BuildSpill) as they are built and their memory is
  // freed; setup() lays out the chunks from the shapes and fills them from
  // the file.
  BlockBuilt placement_at_build(const DeviceMesh& mesh) override;
  void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) override;

  // ---- one step (chunk_step.cpp) ---------------------------------------------

  ReductionStats reduction_stats() const override;
  GatherStats gather_stats() const override;
  void zero_grad() override;
  void prepare_backward(bool) override {}
  void finish_backward() override;
  std::vector<GradPiece> grad_pieces() override;
  void set_loss_scale(double scale) override { unscale_ = 1.0 / scale; }
  bool gradients_finite(const std::vector<GradPiece>&) override;
  double gradient_norm(const std::vector<GradPiece>&, const DeviceMesh& mesh) override;
  void scale_gradients(std::vector<GradPiece>&, double factor) override {
    scales_.push_back(factor);  // applied chunk by chunk in step()
  }
  void step(double lr) override;

  // ---- state (chunk_state.cpp) -----------------------------------------------

  MemoryStats memory() const override;
  std::vector<PlacedParameter> parameters_at_rest() override;
  at::Tensor master_of(const at::Tensor& param) override;
  std::vector<StatePiece> optimizer_state() override;
  void after_load() override;
  int64_t optimizer_steps() const override { return optimizer_->step_count(); }
  void set_optimizer_steps(int64_t steps) override { optimizer_->set_step_count(steps); }

  ~ChunkedMemory() override;

 private:
  // The executor's chunks: kind `kind`, index k. Under ZeRO-1 a rank holds
  // the optimizer's chunks (moments, masters) of the indices it owns only.
  memory::ChunkId id(Kind kind, size_t k) const { return t_.id(kind, k); }
  bool has(Kind kind, size_t k) const { return t_.has(kind, k); }
  // This rank keeps chunk k of `kind` between uses: not another rank's
  // optimizer chunk (ZeRO-1 and up) nor its parameter chunk (ZeRO-3).
  bool holds(Kind kind, size_t k) const {
    return has(kind, k) && (kind != kParam || zero_stage_ < 3 || owns(k));
  }
  comm::WorkPtr broadcast_from_owner(memory::ChunkId c);
  // The ranks chunk index k's gradients are averaged over.
  const DataDomain& domain(size_t k) const { return domains_[chunk_domain_[k]]; }
  // ZeRO: the ranks chunk index k is spread over (1 without ZeRO), its
  // owner and this rank's place among them.
  int shards(size_t k) const { return zero_stage_ >= 1 ? static_cast<int>(domain(k).ranks) : 1; }
  int shard_rank(size_t k) const {
    return zero_stage_ >= 1 ? static_cast<int>(domain(k).index) : 0;
  }
  int owner(size_t k) const { return static_cast<int>(k % static_cast<size_t>(shards(k))); }
  bool owns(size_t k) const { return owner(k) == shard_rank(k); }
  // The kinds of state (chunk_trace.h): a kind of 2-byte elements packs at
  // half the offsets into chunks of half the bytes (rounded up to the
  // direct-I/O alignment).
  // Bytes of one element, of a chunk, and of parameter i's slot, in a kind.
  int64_t elem_bytes(size_t kind) const {
    return kind == kParam || kind == kGrad ? static_cast<int64_t>(c10::elementSize(dtype_)) : 4;
  }
  int64_t kind_bytes(size_t kind) const {
    const int64_t align = memory::kDirectIoAlignment;
    return (chunk_bytes_ / 4 * elem_bytes(kind) + align - 1) / align * align;
  }
  int64_t slot_offset(size_t kind, size_t i) const {
    return layout_.slots[i].offset / 4 * elem_bytes(kind);
  }
  int64_t slot_bytes(size_t kind, size_t i) const {
    return layout_.slots[i].bytes / 4 * elem_bytes(kind);
  }
  std::map<const void*, size_t> param_index() const;
  void finish_skipped_step();

  // ---- set-up (chunks.cpp) ---------------------------------------------------

  void lay_out_chunks(const RunConfig& config);
  void find_uses(const RunConfig& config);
  void build_trace();
  void make_plan(const RunConfig& config);
  void plan_for(int64_t budget);
  // Building into place: block's parameters to spill_, their memory freed.
  void spill_block(const std::vector<PlacedParameter>& parameters);
  // Error unless p's tensor is a CPU tensor over a storage of its own.
  void check_owns_storage(const PlacedParameter& p) const;
  void make_optimizer(const RunConfig& config);
  void make_executor();
  void install_hooks();

  // ---- the trace (chunk_step.cpp) --------------------------------------------

  at::Tensor& tensor_of(size_t kind, size_t i);
  void bind(memory::ChunkId c, std::byte* base);
  void advance(TraceStep expected);
  void end_current_step();
  void finish_reductions();
  void take_norm(size_t i);
  void share_norms();
  void tied_norms();
  void begin(size_t s);
  void launch_gathers(size_t s, bool ahead);
  void count_resident();

  // ---- state (chunk_state.cpp) -----------------------------------------------

  void materialize();

  // The ranks a gradient is averaged over (kolos/core/data_domains.h);
  // domains_[0] is the whole data group.
  std::vector<DataDomain> domains_;
  std::vector<size_t> param_domain_;  // [parameter]
  std::vector<size_t> chunk_domain_;  // [chunk index]: its parameters' domain
  // [domain]: its parameters whose norms ZeRO-2/3 share (not tied or unused).
  std::vector<std::vector<size_t>> shared_norms_;
  comm::ProcessGroupPtr data_group_;  // dp x ep x sp
  int64_t reduced_bytes_ = 0;         // this step's
  int64_t reductions_ = 0;
  int64_t overlapped_bytes_ = 0;
  int64_t completed_before_finish_ = 0;
  double finish_wait_s_ = 0;
  bool finishing_ = false;  // in finish_backward()
  ChunkSettings settings_;
  int64_t accumulation_ = 1;
  int64_t chunk_bytes_ = 0;            // of an fp32 kind (kind_bytes: of any)
  at::ScalarType dtype_ = at::kFloat;  // of the parameters and gradients
  bool low_ = false;                   // bf16/fp16: master chunks too
  size_t kinds_ = kMaster;             // kinds in use: 4, or 5 with masters
  bool reduce_in_fp32_ = false;
  memory::ChunkSearchResult search_;
  memory::ChunkLayout layout_;
  size_t num_chunks_ = 0;  // per kind
  bool tied_done_ = false;
  int64_t zero_stage_ = 0;
  // The model's parameters while it is built into place, until the
  // executor has filled the chunks from them (make_executor).
  std::unique_ptr<BuildSpill> spill_;
  std::vector<PlacedParameter> params_;                  // trainable, in model order
  std::vector<std::pair<size_t, size_t>> chunk_params_;  // [chunk]: parameters [first, last)
  std::vector<std::vector<size_t>> uses_;                // [block]: parameters it reads
  ChunkTrace t_;  // the steps of an iteration and their chunks
  memory::Plan plan_;
  // A gradient's reduction in flight: `reduced` (the chunk's bytes, or an
  // fp32 copy) is averaged, then multiplied by `factor` (its domain's);
  // `elsewhere`: onto another rank (ZeRO-2/3).
  struct Reduction {
    comm::WorkPtr work;
    size_t param;
    at::Tensor in_chunk, reduced;
    double factor;
    bool elsewhere;
  };
  std::vector<Reduction> pending_;      // launched at the end of the step before
  std::vector<comm::WorkPtr> gathers_;  // in flight, for the next step
  int64_t gathered_bytes_ = 0;          // this step's (GatherStats)
  int64_t gathered_ahead_bytes_ = 0;
  double gather_wait_s_ = 0;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<memory::ChunkExecutor> executor_;
  std::vector<bool> bound_;  // [chunk]: its tensors point into the arena
  size_t cursor_ = 0;        // the next trace step
  size_t current_ = 0;
  bool in_step_ = false;
  std::vector<at::Tensor> norms_;                      // [parameter]: its gradient's norm this step
  std::vector<bool> finite_;                           // [parameter]: fp16: its gradient is finite
  bool norms_shared_ = false;                          // ZeRO-2/3: share_norms() ran this step
  std::optional<double> unscale_;                      // fp16: 1 / this step's loss scale
  std::vector<double> scales_;                         // factors for the gradients, in order
  std::vector<std::vector<at::Tensor>> materialized_;  // [kind][parameter]
  std::map<const void*, size_t> materialized_index_;   // its parameter copies -> parameter
  int64_t peak_total_ = 0;
  int64_t peak_by_kind_[kKinds] = {0, 0, 0, 0, 0};
};

}  // namespace kolos::chunks
