// megatron: Megatron-style sequence parallelism over the tensor-parallel group
// (Korthikanti et al. 2022; docs/sequence-parallel.md, "megatron").
//
// The sp group IS the tp group of tensor mode "1d": no mesh axis of its own
// (parallel.sequence.size is absent, 1 or parallel.tensor.size; the mesh's
// sp axis stays 1). Every rank of the tensor group reads whole samples; the
// split is made inside tp1d's layers, which read the choice when they are set
// up (plugins/tp/tp1d.cpp): the embedding's all-reduce becomes a
// reduce-scatter along the sequence, so the residual stream, the norms and
// the residual adds hold T/tp positions; a column layer's entry (copy_in)
// becomes an all-gather along the sequence (backward: reduce-scatter), a row
// layer's all-reduce a reduce-scatter (backward: all-gather), and the tied LM
// head all-gathers the hidden state, so the logits and the
// vocabulary-parallel loss see every position, against whole targets.
// Attention runs on the gathered sequence with its heads split as tp1d
// splits them: the serial attention core, with positions 0..T-1.
//
// So this plugin is the mode's switch and its checks. Its strategy sees the
// mesh's sp axis of 1: LayerFactory::sequence() is null, the engine's slice
// of a micro-batch (local_positions) is the whole sequence, and the
// gradients role's group stays dp.
#include <torch/torch.h>

#include <string>

#include "kolos/core/error.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/recompute.h"
#include "kolos/core/sequence.h"

namespace kolos {
namespace {

class Megatron : public SequenceStrategy {
 public:
  std::string name() const override { return "megatron"; }

  void configure(const PluginContext& context) override {
    SequenceStrategy::configure(context);  // no keys of its own
    const RunConfig& config = context.config;
    const ConfigSection root = config.section("");
    const int64_t tp = config.parallel.tensor.size;
    const int64_t size = config.parallel.sequence.size;
    const std::string layers = choose_plugins(config).layers;
    if (tp < 2 || layers != "tp1d") {
      const std::string found = tp < 2 ? "parallel.tensor.size = " + std::to_string(tp)
                                       : "layers plugin `" + layers + "` (parallel.tensor.mode = " +
                                             quote_toml(config.parallel.tensor.mode) + ")";
      const std::string want = std::to_string(size > 1 ? size : 2);
      root.fail_at_any(
          {"parallel.tensor.size", "parallel.tensor.mode", "parallel.tensor",
           "parallel.sequence.mode"},
          "sequence mode \"megatron\" splits the sequence over the tensor-parallel group of "
          "tensor mode \"1d\"; found " +
              found + ". Use parallel.tensor = { size = " + want +
              ", mode = \"1d\" }, or sequence mode \"ulysses\" or \"ring\".");
    }
    if (size != 1 && size != tp) {
      root.fail_at_any({"parallel.sequence.size", "parallel.sequence"},
                       "parallel.sequence.size = " + std::to_string(size) +
                           " with sequence mode \"megatron\": its sequence group is the tensor "
                           "group (parallel.tensor.size = " +
                           std::to_string(tp) + "), not an axis of its own; use size = " +
                           std::to_string(tp) + " or leave size out.");
    }
    // Chosen through plugins.sequence while parallel.sequence.mode names
    // another mode, the mesh would get an sp axis of its own.
    if (context.shape.sp != 1) {
      root.fail_at_any({"plugins.sequence", "parallel.sequence.mode"},
                       "the sequence plugin `megatron` runs over the tensor group, but the mesh "
                       "has a sequence axis of " +
                           std::to_string(context.shape.sp) + " ranks (parallel.sequence.mode = " +
                           quote_toml(config.parallel.sequence.mode) +
                           "); select it with parallel.sequence.mode = \"megatron\" instead.");
    }
    const int64_t seq = config.model.seq_len;
    if (seq % tp != 0) {
      const int64_t below = seq / tp * tp;
      root.fail_at_any({"model.seq_len"},
                       "model.seq_len = " + std::to_string(seq) + " does not divide into the " +
                           std::to_string(tp) +
                           " tensor ranks that sequence mode \"megatron\" splits it over "
                           "(parallel.tensor.size = " +
                           std::to_string(tp) + "); nearest valid lengths: " +
                           (below > 0 ? std::to_string(below) + " or " : std::string()) +
                           std::to_string(below + tp) + ".");
    }
  }

  // Whole samples: the tensor group's layers cut the sequence themselves.
  at::Tensor local_positions(int64_t seq) const override {
    return torch::arange(seq, torch::kInt64);
  }

  // Not reached (the strategy's sp group has one rank, so the layers run
  // the serial core themselves); the serial core if it ever is.
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& positions) override {
    (void)positions;
    return recompute_if_selected(&causal_attention, {q, k, v});
  }
};

}  // namespace
}  // namespace kolos

KOLOS_DEFINE_PLUGIN("megatron", "sequence", kolos::SequenceStrategy, kolos::Megatron,
                    "sequence parallelism over the tp1d group: activations outside attention and "
                    "the MLP split along the sequence")
