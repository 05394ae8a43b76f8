// The "sequence" role: sequence (context) parallelism.
//
// The sp ranks of one group share each sample: every rank holds some of the
// sequence's positions (local_positions) and runs every layer on its tokens
// only. Layers that act token by token (embeddings, norms, MLPs, the loss)
// need nothing more; causal attention needs every earlier token's keys and
// values, which is what a sequence plugin supplies: attention() over this
// rank's q, k, v with their global positions.
//
// How a plugin reaches the layers: plan_run gives the layer factory the
// strategy (LayerFactory::set_sequence); CausalSelfAttention calls
// attention() through it when sp > 1, and positional encodings (GPT's learned
// positions, LLaMA's rotary angles) ask LayerFactory::positions() for the
// global positions of their tokens. The engine slices each micro-batch's
// tokens and targets by local_positions(seq_len).
//
// Kept out of the widely included headers on purpose: only the engine, the
// layers and the sequence plugins include it.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "kolos/core/roles.h"

namespace kolos {

class DeviceMesh;
namespace comm {
class ProcessGroup;
}

class SequenceStrategy : public RolePlugin {
 public:
  virtual ~SequenceStrategy() = default;
  virtual std::string name() const = 0;
  // Called once, after the mesh exists and before the model is built. The
  // default keeps the mesh's sp group.
  virtual void setup(const DeviceMesh& mesh, const RunConfig& config);

  // Ranks along sp (1 before setup).
  int64_t size() const;
  // This rank's coordinate along sp.
  int64_t rank() const { return rank_; }

  // The global positions this rank holds of a sequence of `seq` tokens:
  // int64 [seq / size()], in the order the rank's tokens are laid out.
  virtual at::Tensor local_positions(int64_t seq) const = 0;

  // Causal self-attention of this rank's tokens: q, k, v [B, h, T_local, d]
  // (grouped-query k/v already repeated to h heads), `positions` =
  // local_positions(T) of those tokens; a query attends to every key at a
  // global position <= its own, across the whole sp group. Differentiable
  // (the backward communicates as the forward did). Returns [B, h, T_local, d].
  // Collective over the sp group. A plugin that reaches a purely local
  // attention step wraps it in recompute_if_selected(&causal_attention, ...)
  // so that train.recompute = "selective" keeps acting.
  virtual at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& positions) = 0;

 protected:
  comm::ProcessGroup* group_ = nullptr;  // the sp group (set by setup)
  int64_t rank_ = 0;
};

// softmax(QK^T / sqrt(d)) V with the causal mask over q, k, v = qkv[0..2],
// [B, h, T, d] holding positions 0..T-1 in order: the serial attention core
// (what train.recompute = "selective" recomputes).
at::Tensor causal_attention(const std::vector<at::Tensor>& qkv);

// While one lives (on this thread), layers ignore the sequence strategy and
// run serially on whatever sequence they are given: probes that run whole
// samples on each rank alone (Model::find_block_reads, the pipeline's block
// timing) run without the sp group's collectives.
class SequenceBypassScope {
 public:
  SequenceBypassScope();
  ~SequenceBypassScope();
  SequenceBypassScope(const SequenceBypassScope&) = delete;
  SequenceBypassScope& operator=(const SequenceBypassScope&) = delete;
  static bool active();

 private:
  bool previous_;
};

}  // namespace kolos
