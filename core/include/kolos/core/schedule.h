// The "pipeline" role: which blocks this rank runs and in what order the
// forward and backward passes of a step's micro-batches run.
//
// Without pipeline parallelism the engine runs the single-stage schedule:
// forward and backward of each micro-batch in turn, gradients accumulated,
// the gradient strategy told which backward is the last. A pipeline plugin
// replaces it without any other part changing.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kolos/core/gradient_strategy.h"
#include "kolos/core/model.h"
#include "kolos/core/roles.h"

namespace kolos {

class DeviceMesh;

struct MicroBatch {
  at::Tensor inputs;   // [micro_batch, seq_len] token ids
  at::Tensor targets;  // [micro_batch, seq_len]
};

struct StepContext {
  Model* model = nullptr;
  GradientStrategy* gradients = nullptr;
  const std::vector<MicroBatch>* micro_batches = nullptr;
  // Every micro-batch's loss is multiplied by it before backward (fp16's
  // dynamic loss scale; 1 otherwise). The engine unscales the gradients.
  double loss_scale = 1.0;
};

struct StepLoss {
  double sum = 0.0;   // sum of the micro-batches' mean losses seen by this rank
  int64_t count = 0;  // micro-batches whose loss this rank computed
};

class PipelineSchedule : public RolePlugin {
 public:
  virtual ~PipelineSchedule() = default;
  virtual std::string name() const = 0;
  virtual void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config);
  // Runs every micro-batch's forward and backward. Each micro-batch's loss is
  // scaled by 1/M before backward so accumulated gradients are the mean.
  virtual StepLoss run(StepContext& context) = 0;
  // Fraction of the last step this rank spent idle (0 without pipelining).
  virtual double idle_fraction() const { return 0.0; }
  // Called by the engine after GradientStrategy::finish_backward(), with the
  // strategy's grad_pieces(), before norms and the optimizer step: a
  // schedule whose stages hold copies of one parameter (tied weights) makes
  // their gradients equal here (summed over the stages that hold it).
  // Collective over the stages that hold copies.
  virtual void sync_tied_gradients(std::vector<GradPiece>& pieces) { (void)pieces; }
};

std::shared_ptr<PipelineSchedule> make_single_stage_schedule();

}  // namespace kolos
