// Auxiliary losses (a mixture-of-experts router's load-balancing and z-loss)
// that train the parameters they read without joining the loss the model
// reports, wherever the block that computes them runs: in a pipeline stage
// before the last, inside a recomputed block, on every micro-batch.
//
// with_aux_loss(x, aux) returns x unchanged; in backward, besides passing
// x's gradient through, it gives `aux` the gradient d(objective)/d(aux) =
// the multiplier the schedule gives each micro-batch's main loss (the loss
// scale over the number of micro-batches), so `aux` counts as if added to
// every micro-batch's loss. The schedules set that multiplier before each
// backward (set_aux_loss_multiplier).
#pragma once

#include <ATen/core/Tensor.h>

namespace kolos {

at::Tensor with_aux_loss(const at::Tensor& x, const at::Tensor& aux);

// What each micro-batch's loss is multiplied by before its backward.
void set_aux_loss_multiplier(double multiplier);
double aux_loss_multiplier();

}  // namespace kolos
