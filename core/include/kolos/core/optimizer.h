// AdamW over slots: the optimizer every gradients plugin uses.
//
// A slot is a parameter (or a shard of one: ZeRO) with the gradient tensor
// to apply and its Placement; the slot's state (first and second moments)
// has the parameter's local shape and placement, so checkpoints and memory
// accounting see it like any other piece. State is allocated when a slot is
// added (zeros), so a checkpoint can be loaded into it before the first step.
// The update is LibTorch's AdamW (decoupled weight decay, bias correction),
// so results match torch::optim::AdamW: with settings.fused (the default),
// slots whose four tensors are contiguous fp32 CPU tensors go through the
// fused kernel (kolos/kernels/adamw.h: one pass, LibTorch's rounding, the
// same bits on CPUs where ATen runs its AVX2/AVX-512 kernels) in one
// multi-tensor call on at::get_num_threads() threads; every other slot, all
// slots when fused is false, and all slots where ATen runs its "default"
// (non-FMA) kernels, take LibTorch's ops, operation for operation.
//
// Mixed precision: a bf16 or fp16 parameter gets an fp32 master copy
// (AdamWSlot::master) made when the slot is added, and fp32 moments. The
// update runs on the master with the low-precision gradient widened to
// fp32, then the parameter receives the master rounded to its dtype (the
// fused kernel does both in its one pass). The master is the parameter's
// truth: checkpoints save it (master_of), and after loading one,
// copy_masters_to_params() rounds it into the parameters again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/core/gradient_strategy.h"

namespace kolos {

struct AdamWSlot {
  std::string name;  // the parameter's name
  at::Tensor param;  // updated in place
  at::Tensor grad;   // read at step(); same shape as param
  Placement placement;
  at::Tensor exp_avg;
  at::Tensor exp_avg_sq;
  at::Tensor master;  // fp32 copy of a bf16/fp16 param; undefined for fp32 params
};

class AdamW {
 public:
  explicit AdamW(AdamWSettings settings);

  void add(std::string name, at::Tensor param, at::Tensor grad, Placement placement);
  // One update of every slot with learning rate `lr`; increments step().
  void step(double lr);
  // The update step `step` (1-based: bias correction) of slots [first,
  // last) only, exactly as step() updates them; the step count is left
  // alone. For a caller that holds only some slots' tensors at a time (the
  // memory role steps its chunks one by one, then sets the count).
  void update(double lr, size_t first, size_t last, int64_t step);

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  const std::vector<AdamWSlot>& slots() const { return slots_; }
  std::vector<AdamWSlot>& slots() { return slots_; }
  const AdamWSettings& settings() const { return settings_; }

  // "exp_avg/<name>" and "exp_avg_sq/<name>" for every slot (live tensors:
  // writing into them loads a state). The step count is step_count().
  std::vector<StatePiece> state_pieces() const;
  // The fp32 master of `param` (a slot's param, matched by TensorImpl), or
  // an undefined tensor when the slot has none or no slot holds it.
  at::Tensor master_of(const at::Tensor& param) const;
  // Every master rounded into its parameter (after a checkpoint was loaded
  // into the masters).
  void copy_masters_to_params();
  // Bytes of the fp32 masters.
  int64_t master_bytes() const;
  int64_t state_bytes() const;

 private:
  AdamWSettings settings_;
  std::vector<AdamWSlot> slots_;
  int64_t step_ = 0;
};

}  // namespace kolos
