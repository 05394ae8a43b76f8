// ring: ring attention with zigzag placement over the mesh's sp axis
// (docs/sequence-parallel.md, "Ring attention").
//
// The sequence is cut into 2*sp chunks; rank r of the sp group holds chunks
// r and 2*sp-1-r of every sample (zigzag_positions), so that under the
// causal mask every rank has the same share of the attention's work. Every
// layer but attention acts token by token on those positions. Attention is
// ring_attention (ring_attention.h): each rank keeps its queries while the
// key/value blocks travel once around the group, folded into the output by
// an online softmax; the backward is a second ring that carries the blocks
// again with their dK/dV accumulators. Per layer and rank, with
// X = B*h*(T/sp)*d and e the activations' element size, forward sends
// (sp-1) * (2 X e + 8 T/sp) bytes (k and v with their int64 positions);
// backward the same again plus sp float32 dK/dV accumulators, sp * 2 X 4
// (the last hop brings each home). ring_attention_test counts them.
//
// Heads need not divide by sp (every rank keeps all its heads); the sequence
// length must divide by 2*sp.
//
// train.recompute = "selective" recomputes nothing here: what it exists to
// drop, the T x T attention probabilities, the kernel never keeps (it saves
// q, k, v, the output and the log-sum-exp, O(T_local) each, and recomputes
// each tile's scores in its backward, as flash attention does). Recomputing
// the ring itself would only repeat its communication.
#include <torch/torch.h>

#include <string>

#include "kolos/core/error.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/sequence.h"
#include "mode_checks.h"
#include "ring_attention.h"

namespace kolos {
namespace {

class Ring : public SequenceStrategy {
 public:
  std::string name() const override { return "ring"; }

  void configure(const PluginContext& context) override {
    SequenceStrategy::configure(context);  // no keys of its own
    const auto [config, root, sp, tp, at_sp] = sequence::mode_inputs(context);
    sequence::require_tensor_1d(config, tp, sp, "ring");
    // Zigzag placement: 2*sp equal chunks, two per rank. Checked here, where
    // the message can point at the key, before the mesh communicates.
    const int64_t seq = config.model.seq_len;
    const int64_t chunks = 2 * sp;
    if (seq % chunks != 0) {
      const int64_t below = seq / chunks * chunks;
      root.fail_at_any({"model.seq_len"},
                       "model.seq_len = " + std::to_string(seq) +
                           " does not divide into the 2*sp = " + std::to_string(chunks) +
                           " zigzag chunks of sequence mode \"ring\" (" + at_sp +
                           "); nearest valid lengths: " +
                           (below > 0 ? std::to_string(below) + " or " : std::string()) +
                           std::to_string(below + chunks) + ".");
    }
  }

  at::Tensor local_positions(int64_t seq) const override {
    return zigzag_positions(seq, size(), rank());
  }

  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& positions) override {
    // No recompute_if_selected: see the top of this file.
    return ring_attention(q, k, v, positions, *group_);
  }
};

}  // namespace
}  // namespace kolos

KOLOS_DEFINE_PLUGIN("ring", "sequence", kolos::SequenceStrategy, kolos::Ring,
                    "sequence parallelism: ring attention with zigzag placement")
