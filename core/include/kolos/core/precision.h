// Mixed precision (train.precision = "bf16" | "fp16"; docs/precision.md).
//
// Parameters, activations and gradients are held in the low dtype; every
// optimizer slot keeps an fp32 master and fp32 moments (optimizer.h); the
// loss is computed in fp32 from logits widened to fp32; fp16 adds dynamic
// loss scaling (LossScaler) so that small gradients do not flush to zero.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kolos/core/run_config.h"

namespace kolos {

class Model;

// The dtype of parameters and activations for train.precision.
at::ScalarType precision_dtype(const RunConfig& config);

// Runs a tiny matmul, layer norm, GELU and softmax in the precision's dtype
// on this LibTorch. A ConfigError located at train.precision when one is
// not implemented (LibTorch 1.x had no fp16 matmul on the CPU; a build
// without a kernel would fail the same way), naming the LibTorch version
// and what works.
void check_precision_runs(const RunConfig& config);

// Every parameter of `model` (or of one block, as the model is built)
// converted to `dtype` in place (Tensor::set_data: the tensors keep their
// identity, so tied weights stay tied).
void cast_parameters(Model& model, at::ScalarType dtype);
void cast_parameters(const std::vector<PlacedParameter>& parameters, at::ScalarType dtype);

// Every parameter of `model` (or of one block) moved to `device` in place,
// the same way (tied weights stay tied; gradients are made on the device by
// backward).
void move_parameters(Model& model, const at::Device& device);
void move_parameters(const std::vector<PlacedParameter>& parameters, const at::Device& device);

// Dynamic loss scaling as torch.cuda.amp.GradScaler does it: multiply the
// loss by scale() before backward; after an overflow-free step, count it,
// and double the scale after growth_interval such steps in a row; after a
// step whose gradients hold an inf or NaN (agreed over every rank), skip
// the optimizer step and halve the scale.
class LossScaler {
 public:
  LossScaler(double init, int64_t growth_interval)
      : scale_(init), growth_interval_(growth_interval) {}
  double scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }
  void restore(double scale, int64_t good_steps) {
    scale_ = scale;
    good_steps_ = good_steps;
  }
  // After a step: `overflow` as agreed by every rank.
  void update(bool overflow);

 private:
  double scale_;
  int64_t growth_interval_;
  int64_t good_steps_ = 0;
};

}  // namespace kolos
