// The "gradients + optimizer" role: how gradients are reduced and where the
// optimizer states live (plugins dp, zero1, zero2, zero3).
//
// The engine drives one optimizer step as:
//   zero_grad()
//   for each micro-batch m of M:  prepare_backward(m == M-1); forward; backward
//   finish_backward()            // every reduction complete
//   pieces = grad_pieces()       // norms, clipping (engine scales in place)
//   step(lr)
// A strategy must not communicate on accumulation micro-batches except what
// its sharding needs, and must enqueue its collectives in the same order on
// every rank of a group.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolos/core/model.h"
#include "kolos/core/roles.h"

namespace kolos {

class AdamW;
class DeviceMesh;

// A named tensor piece with its placement (checkpoints, metrics).
struct StatePiece {
  std::string name;
  at::Tensor tensor;
  Placement placement;
};

struct GradPiece {
  at::Tensor grad;  // this rank's piece (reduced), may be padded with zeros
  Placement placement;
};

struct MemoryStats {
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t total() const { return parameter_bytes + gradient_bytes + optimizer_bytes; }
};

// How one step's gradient reductions went on this rank (metrics).
struct ReductionStats {
  int64_t bytes = 0;  // bytes reduced this step (buffers handed to collectives)
  // Of which launched while backward still had gradients to compute: by a
  // gradient hook other than the backward's last (what the last hook and
  // finish_backward() launch overlaps nothing).
  int64_t bytes_during_backward = 0;
  double wait_s = 0.0;     // seconds spent in finish_backward()
  int64_t reductions = 0;  // collectives launched this step
  // Reductions whose Work had completed when finish_backward() was called
  // (observed with Work::is_completed(), or already waited for).
  int64_t completed_before_finish = 0;
  // The buckets' all-reduce path when the group spans nodes or it was set
  // hierarchical ("flat" | "hierarchical"); empty otherwise. all_reduce_json:
  // the choice with its measurements, for the metrics header.
  std::string all_reduce_path;
  std::string all_reduce_json;
  double overlap_fraction() const {
    return bytes > 0 ? static_cast<double>(bytes_during_backward) / static_cast<double>(bytes)
                     : 0.0;
  }
  // Another group's reductions of the same step added in (the all-reduce
  // path stays this one's).
  void add(const ReductionStats& more) {
    bytes += more.bytes;
    bytes_during_backward += more.bytes_during_backward;
    wait_s += more.wait_s;
    reductions += more.reductions;
    completed_before_finish += more.completed_before_finish;
  }
};

// How one step's parameter gathers went on this rank (ZeRO-3: parameters
// kept by their owners and gathered where a block needs them; metrics).
struct GatherStats {
  // Bytes of the buffers gathered into this step on this rank (a block's
  // whole parameters, a parameter chunk), the owner's share included.
  int64_t bytes = 0;
  // Of which launched ahead of the block that needs them (while the block
  // before computed): their transfer overlapped compute.
  int64_t bytes_ahead = 0;
  double wait_s = 0.0;  // seconds blocks waited for their gathers to complete
  double ahead_fraction() const {
    return bytes > 0 ? static_cast<double>(bytes_ahead) / static_cast<double>(bytes) : 0.0;
  }
};

class GradientStrategy : public RolePlugin {
 public:
  virtual ~GradientStrategy() = default;
  virtual std::string name() const = 0;
  // Building into place: a strategy that keeps only part of each parameter
  // on this rank returns what takes that part from each block as the model
  // is built (BlockBuilt, model.h), already in the run's precision and on
  // its device, and frees the rest; setup() then finds those parameters'
  // memory freed. Empty (the default): the model is built whole and setup()
  // takes it from there. Called once, before the model is built.
  virtual BlockBuilt placement_at_build(const DeviceMesh& mesh) {
    (void)mesh;
    return nullptr;
  }
  virtual void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) = 0;
  virtual void zero_grad() = 0;
  // `sync`: this is the last micro-batch of the step; reduce its gradients.
  // fp16: the loss scale of the step about to run, called after zero_grad();
  // its gradients arrive multiplied by it, and the engine divides them by it
  // (scale_gradients) before their norm. A strategy that takes norms as
  // gradients become final needs it; the default ignores it.
  virtual void set_loss_scale(double scale) { (void)scale; }
  virtual void prepare_backward(bool sync) = 0;
  virtual void finish_backward() = 0;
  virtual std::vector<GradPiece> grad_pieces() = 0;
  // What the engine does with the step's gradients between finish_backward()
  // and step(), given grad_pieces(). The defaults act on the pieces; a
  // strategy whose gradients are not all in memory at once (the memory
  // role's chunks) returns no pieces and does the same arithmetic on its
  // own, with the same results.
  // - whether every gradient is finite (this rank's; the engine reduces it);
  virtual bool gradients_finite(const std::vector<GradPiece>& pieces);
  // - the global L2 norm (collective, as global_grad_norm);
  virtual double gradient_norm(const std::vector<GradPiece>& pieces, const DeviceMesh& mesh);
  // - every gradient multiplied by `factor` (unscaling, clipping), in place,
  //   in the order of the calls.
  virtual void scale_gradients(std::vector<GradPiece>& pieces, double factor);
  virtual void step(double lr) = 0;
  virtual MemoryStats memory() const = 0;
  // The last step's reductions; zeros for a strategy that does not report them.
  virtual ReductionStats reduction_stats() const { return {}; }
  // The last step's parameter gathers; zeros for a strategy without them.
  virtual GatherStats gather_stats() const { return {}; }

  // What a checkpoint saves and loads, as live tensors with placements
  // (loading writes into them):
  // - the parameters as this strategy stores them at rest (ZeRO-3: shards);
  //   the default is the model's placed parameters;
  virtual std::vector<PlacedParameter> parameters_at_rest();
  // - the optimizer: "exp_avg/<param>", "exp_avg_sq/<param>" pieces, and
  //   its step count.
  virtual std::vector<StatePiece> optimizer_state() = 0;
  virtual int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(int64_t steps) = 0;
  // The strategy's AdamW, if it uses one: under mixed precision the engine
  // checkpoints its fp32 masters in place of the low-precision parameters
  // at rest, and rounds them back into the parameters after a load.
  virtual AdamW* adamw() { return nullptr; }
  // The fp32 master of a bf16/fp16 parameter at rest (one that
  // parameters_at_rest() returned), what a checkpoint saves in its place;
  // undefined when there is none. By default adamw()'s.
  virtual at::Tensor master_of(const at::Tensor& param);
  // Called by Engine::load_state() once a state's pieces (and, under mixed
  // precision, the masters' roundings) are written: a strategy whose pieces
  // at rest are not the model's tensors makes the model's tensors whole
  // again from them (collective over the strategy's groups).
  virtual void after_load() {}

 protected:
  Model* model_ = nullptr;  // set by setup() implementations
};

// Global L2 norm of gradient pieces (collective over the mesh; the same
// value on every rank): each distinct piece counted once. Squares are summed
// over the mesh axes a piece's placement says are sharded, and under
// pipelining also over pp, where a piece held by several stages (a tied
// weight) counts on its canonical replica (Placement::is_canonical_replica).
double global_grad_norm(const std::vector<GradPiece>& pieces, const DeviceMesh& mesh);
// The same from norms already taken: norms[i] is the L2 norm (a 0-dim tensor)
// of the gradient of a piece placed as placements[i]; an undefined norm is
// a piece with no gradient. The same arithmetic, so the same value.
double global_grad_norm(const std::vector<at::Tensor>& norms,
                        const std::vector<Placement>& placements, const DeviceMesh& mesh);

// The AdamW options of a run, as LibTorch's AdamW takes them.
struct AdamWSettings {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
  // Update contiguous fp32 CPU slots with the fused kernel (kolos/kernels/adamw.h);
  // other slots, and all of them when false, take the LibTorch-ops path.
  bool fused = true;
};
AdamWSettings adamw_settings(const OptimConfig& config);

// Whether a gradients plugin reduces over its group in fp32: low-precision
// gradients widened for the reduction and rounded back once
// (train.reduce_dtype = "fp32" under bf16/fp16).
bool reduce_in_fp32(const RunConfig& config);

}  // namespace kolos
