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
// For the planner: the layouts each mode offers and the collectives a rank
// issues per block. Torch-free, in libkolos_plugin_terms.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

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

// The layouts each mode offers: ulysses and ring any sp > 1, hybrid every
// Ulysses degree a with 1 < a < sp dividing sp, megatron sp = 1 beside a
// tensor group of 1d.
void offer(const LayoutQuery& mesh, const char* mode, int64_t ulysses,
           std::vector<LayoutQuery>& out) {
  offer_layout(mesh, "sequence", mode, ulysses, out);
}

void ulysses_layouts(const LayoutQuery& mesh, std::vector<LayoutQuery>& out) {
  if (mesh.sp > 1) offer(mesh, "ulysses", 1, out);
}

void ring_layouts(const LayoutQuery& mesh, std::vector<LayoutQuery>& out) {
  if (mesh.sp > 1) offer(mesh, "ring", 1, out);
}

void hybrid_layouts(const LayoutQuery& mesh, std::vector<LayoutQuery>& out) {
  for (int64_t a = 2; a < mesh.sp; ++a) {
    if (mesh.sp % a == 0) offer(mesh, "hybrid", a, out);
  }
}

void megatron_layouts(const LayoutQuery& mesh, std::vector<LayoutQuery>& out) {
  if (mesh.sp == 1 && mesh.tp > 1 && mesh.tensor_mode == "1d") offer(mesh, "megatron", 1, out);
}

// X: the bytes of one of the rank's [b, s/sp, h/tp] activations.
double activation_bytes(const MemoryQuery& q) {
  return q.element_bytes * static_cast<double>(q.micro_batch) * q.model.seq /
         static_cast<double>(q.sp) * q.model.hidden / static_cast<double>(q.tp);
}

// Ulysses over a ranks spaced `stride` apart: forward, an all-to-all of q,
// k and v (3X) before the core and one of its output (X) after; backward
// the same in reverse.
void ulysses_calls(const MemoryQuery& q, int64_t a, int64_t stride,
                   std::vector<CollectiveCall>& out) {
  if (a <= 1) return;
  const double X = activation_bytes(q);
  for (const bool backward : {false, true}) {
    for (const double bytes : {3 * X, X}) {
      CollectiveCall c;
      c.op = Collective::kAllToAll, c.bytes = bytes, c.n = a, c.stride = stride;
      c.backward = backward;
      out.push_back(c);
    }
  }
}

// A ring of r ranks spaced `stride` apart: forward, r - 1 hops of the K/V
// block (2X); backward, r - 1 hops of K/V and r hops of the dK/dV
// accumulators (2X in float32). Each hop hides behind the attention tile it
// feeds; the slowest hop paces every step.
void ring_calls(const MemoryQuery& q, int64_t r, int64_t stride, std::vector<CollectiveCall>& out) {
  if (r <= 1) return;
  const double X = activation_bytes(q), dr = static_cast<double>(r);
  CollectiveCall c;
  c.op = Collective::kSendRecv, c.n = r, c.stride = stride;
  c.hides = Hides::kAttention, c.sync = SyncPattern::kRing, c.span = r;
  c.bytes = 2 * X, c.count = dr - 1;
  out.push_back(c);
  c.backward = true;
  out.push_back(c);
  c.bytes = 2 * X * 4 / q.element_bytes, c.count = dr;
  out.push_back(c);
}

void ulysses_traffic(const MemoryQuery& q, std::vector<CollectiveCall>& out) {
  ulysses_calls(q, q.sp, q.tp, out);
}

void ring_traffic(const MemoryQuery& q, std::vector<CollectiveCall>& out) {
  ring_calls(q, q.sp, q.tp, out);
}

void hybrid_traffic(const MemoryQuery& q, std::vector<CollectiveCall>& out) {
  const int64_t a = std::stoll(q.setting("parallel.sequence.ulysses", "1"));
  ulysses_calls(q, a, q.tp, out);
  ring_calls(q, q.sp / a, q.tp * a, out);
}

// Megatron's gathers and scatters replace tp1d's all-reduces, the same
// bytes: the layers plugin's traffic counts them.
void megatron_traffic(const MemoryQuery&, std::vector<CollectiveCall>&) {}

PluginTerms terms(const char* name,
                  AttentionMemory (*attention)(const MemoryQuery&, double, double),
                  std::string (*problem)(const LayoutQuery&),
                  void (*layouts)(const LayoutQuery&, std::vector<LayoutQuery>&),
                  void (*traffic)(const MemoryQuery&, std::vector<CollectiveCall>&)) {
  PluginTerms t = layout_plugin_terms(name, "sequence", name, problem, layouts, traffic);
  t.attention = attention;
  return t;
}

}  // namespace

KOLOS_PLUGIN_TERMS(terms("ulysses", dense_attention_memory, ulysses_layout, ulysses_layouts,
                         ulysses_traffic));
KOLOS_PLUGIN_TERMS(terms("megatron", megatron, megatron_layout, megatron_layouts,
                         megatron_traffic));
KOLOS_PLUGIN_TERMS(terms("ring", ring_kernel, ring_layout, ring_layouts, ring_traffic));
KOLOS_PLUGIN_TERMS(terms("hybrid", ring_kernel, hybrid_layout, hybrid_layouts, hybrid_traffic));

}  // namespace kolos
