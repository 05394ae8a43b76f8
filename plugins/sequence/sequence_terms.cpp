// The sequence modes' memory terms (kolos/core/plugin_terms.h): what one
// block's attention keeps for a rank's seq/sp positions.
//   ulysses   the dense core over the whole sequence for heads/sp heads:
//             heads x seq x seq / sp probabilities per rank.
//   megatron  the dense core (sp = 1 in the mesh) and the norms' tensors
//             split over the tensor group, but for the two a column layer
//             keeps gathered whole for its backward.
//   ring, hybrid  the ring kernel, which keeps no seq x seq tensor: contiguous
//             copies of q, k and v and a float32 log-sum-exp per query and
//             head; its backward holds one tile pair's float32 scores,
//             probabilities and their gradients at a time (tiles of at most
//             512 rows; a rank's two zigzag chunks are separate tiles) and
//             ten float32 blocks of the rank's micro x seq/sp x hidden/tp:
//             the output gradient, dq, two stacked K/V blocks (sent and
//             arriving), two stacked dK/dV accumulators.
// Layouts (docs/sequence-parallel.md): ulysses, ring and hybrid run beside
// tensor mode 1d only; ulysses splits the heads of a tensor rank and the
// sequence by sp, ring the sequence into 2 x sp zigzag chunks, hybrid the
// heads by a and the sequence by r x lcm(2, a); megatron the sequence by tp.
// Torch-free, in libkolos_plugin_terms.
#include <algorithm>
#include <numeric>
#include <string>

#include "kolos/core/plugin_terms.h"

namespace kolos {
namespace {

AttentionMemory megatron(const MemoryQuery& q, double micro, double tokens) {
  AttentionMemory a = dense_attention_memory(q, micro, tokens);
  a.norms_over_tensor = true;
  return a;
}

AttentionMemory ring_kernel(const MemoryQuery& q, double micro, double tokens) {
  const ModelDims& m = q.model;
  const double tp = static_cast<double>(q.tp);
  AttentionMemory a;
  a.kernel = "ring kernel";
  a.saved = micro * m.heads * tokens * 4 / q.element_bytes + 3 * micro * tokens * m.hidden;
  const double tile = std::min(512.0, tokens / 2);
  a.backward = 4 * 4 * micro * m.heads / tp * tile * tile + 10 * 4 * micro * tokens * m.hidden / tp;
  return a;
}

bool beside_grid(const LayoutQuery& l) { return l.tp > 1 && l.tensor_mode != "1d"; }
const char* const kNeeds1d = "sp: ulysses/ring/hybrid need tensor mode 1d";

std::string ulysses_layout(const LayoutQuery& l) {
  if (beside_grid(l)) return kNeeds1d;
  if ((l.heads / l.tp) % l.sp != 0 || l.seq % l.sp != 0) {
    return "sp: ulysses needs heads per tensor rank and seq_len divisible by sp";
  }
  return "";
}

std::string ring_layout(const LayoutQuery& l) {
  if (beside_grid(l)) return kNeeds1d;
  if (l.seq % (2 * l.sp) != 0) return "sp: ring needs seq_len divisible by 2*sp";
  return "";
}

std::string hybrid_layout(const LayoutQuery& l) {
  if (beside_grid(l)) return kNeeds1d;
  const int64_t a = l.ulysses;
  if (a < 1 || l.sp % a != 0 || (l.heads / l.tp) % a != 0 ||
      l.seq % (l.sp / a * std::lcm<int64_t>(2, a)) != 0) {
    return "sp: hybrid needs heads per tensor rank divisible by a, seq_len by r*lcm(2, a)";
  }
  return "";
}

std::string megatron_layout(const LayoutQuery& l) {
  if (l.seq % l.tp != 0) return "sp: megatron needs seq_len divisible by tp";
  return "";
}

}  // namespace

KOLOS_PLUGIN_TERMS(PluginTerms{"ulysses", "sequence", nullptr, dense_attention_memory, nullptr,
                               nullptr, ulysses_layout});
KOLOS_PLUGIN_TERMS(PluginTerms{"megatron", "sequence", nullptr, megatron, nullptr, nullptr,
                               megatron_layout});
KOLOS_PLUGIN_TERMS(PluginTerms{"ring", "sequence", nullptr, ring_kernel, nullptr, nullptr,
                               ring_layout});
KOLOS_PLUGIN_TERMS(PluginTerms{"hybrid", "sequence", nullptr, ring_kernel, nullptr, nullptr,
                               hybrid_layout});

}  // namespace kolos
