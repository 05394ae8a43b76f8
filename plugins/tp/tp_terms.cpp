// The tensor-parallel layers' terms (kolos/core/plugin_terms.h).
// Memory: which of a block's saved tensors divide over the tensor group.
// tp1d's column and row layers take the norms' tensors whole (and a
// recomputed block's input); the grids (2d, 2.5d, 3d) cut every activation
// over their q x q (x d) ranks. Layouts (docs/tensor-parallel.md): heads,
// kv heads and the MLP's width split over tp (1d) or the grid's side q,
// and a grid's micro-batch over its batch blocks (2d: q, 2.5d: d x q, 3d:
// q x q). Torch-free, in libkolos_plugin_terms.
#include <string>

#include "kolos/core/plugin_terms.h"

namespace kolos {
namespace {

TensorCut one_d(const MemoryQuery& q) {
  TensorCut cut;
  cut.rest = static_cast<double>(q.tp);
  return cut;
}

TensorCut grid(const MemoryQuery& q) {
  const double tp = static_cast<double>(q.tp);
  return TensorCut{tp, tp, tp};
}

std::string divides(const LayoutQuery& l, int64_t split, int64_t batch_blocks) {
  if (split < 1 || l.heads % split != 0 || l.kv_heads % split != 0 || l.inner % split != 0) {
    return "tp: heads, kv heads or MLP width do not divide by the tensor split";
  }
  if (l.micro_batch > 0 && l.micro_batch % batch_blocks != 0) {
    return "tp: micro_batch not divisible by the grid's batch blocks";
  }
  return "";
}

std::string one_d_layout(const LayoutQuery& l) { return divides(l, l.tp, 1); }

std::string two_d_layout(const LayoutQuery& l) {
  const int64_t q = exact_root(l.tp, 2);
  if (q < 2) return "tp: 2d needs a square tensor size";
  return divides(l, q, q);
}

std::string two_and_half_d_layout(const LayoutQuery& l) {
  const int64_t d = l.depth;
  const int64_t q = d >= 1 && l.tp % d == 0 ? exact_root(l.tp / d, 2) : 0;
  if (q < 2) return "tp: 2.5d needs a tensor size d x q x q";
  return divides(l, q, d * q);
}

std::string three_d_layout(const LayoutQuery& l) {
  const int64_t q = exact_root(l.tp, 3);
  if (q < 2) return "tp: 3d needs a cubic tensor size";
  return divides(l, q, q * q);
}

}  // namespace

KOLOS_PLUGIN_TERMS(PluginTerms{"tp1d", "layers", one_d, nullptr, nullptr, nullptr, one_d_layout});
KOLOS_PLUGIN_TERMS(PluginTerms{"tp2d", "layers", grid, nullptr, nullptr, nullptr, two_d_layout});
KOLOS_PLUGIN_TERMS(PluginTerms{"tp2p5d", "layers", grid, nullptr, nullptr, nullptr,
                               two_and_half_d_layout});
KOLOS_PLUGIN_TERMS(PluginTerms{"tp3d", "layers", grid, nullptr, nullptr, nullptr, three_d_layout});

}  // namespace kolos
