// Activation recomputation (train.recompute; docs/architecture.md,
// "Recomputation").
//
// LibTorch's C++ API has no torch.utils.checkpoint, so this is ours:
// recomputed() runs a function without autograd keeping what it would save
// inside it, and re-runs it with gradients enabled when backward reaches it.
// Model::forward wraps whole blocks with it ("full"); the attention core
// wraps its softmax(QK^T/sqrt(d))V with recompute_if_selected()
// ("selective"), which acts only inside a block that Model::forward marked
// with AttentionRecomputeScope.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace kolos {

using RecomputeFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// fn(inputs), run under no-grad: only `inputs` are kept for backward (and
// the CPU generator's state, so that random draws replay identically). When
// backward reaches the outputs, fn runs again, with gradients enabled, on
// detached copies of the inputs, and autograd::grad gives the gradients of
// the inputs and of `parameters`, which flow on as if fn had been recorded
// normally (into the parameters' gradient accumulators and their hooks).
// `parameters` must list every trainable tensor fn reads that is not one of
// `inputs` (a block's own parameters); a tensor fn reads but that is in
// neither list gets no gradient. fn is called later from backward, so it
// must own what it captures. Without grad mode, or when nothing needs a
// gradient, this is fn(inputs).
std::vector<at::Tensor> recomputed(RecomputeFn fn, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& parameters);

// How many times, in this process, backward has re-run a function that
// recomputed() wrapped (whole blocks and selective attention cores alike).
// Observed where the re-run happens, so a test can tell a recomputation
// that ran from one that silently kept the activations.
int64_t recomputations_run();

// Marks (on this thread) that the block now running has its attention core
// recomputed (train.recompute = "selective"); restores the previous state on
// destruction.
class AttentionRecomputeScope {
 public:
  explicit AttentionRecomputeScope(bool active);
  ~AttentionRecomputeScope();
  AttentionRecomputeScope(const AttentionRecomputeScope&) = delete;
  AttentionRecomputeScope& operator=(const AttentionRecomputeScope&) = delete;
  static bool active();

 private:
  bool previous_;
};

// fn(inputs) through recomputed() inside an active AttentionRecomputeScope,
// plainly otherwise. fn must read no parameter (the attention core reads
// q, k and v only).
at::Tensor recompute_if_selected(at::Tensor (*fn)(const std::vector<at::Tensor>& inputs),
                                 const std::vector<at::Tensor>& inputs);

}  // namespace kolos
