// The tensor-parallel layers' terms (kolos/core/plugin_terms.h).
// Memory: which of a block's saved tensors divide over the tensor group.
// tp1d's column and row layers take the norms' tensors whole (and a
// recomputed block's input); the grids (2d, 2.5d, 3d) cut every activation
// over their q x q (x d) ranks. Layouts (docs/tensor-parallel.md): heads,
// kv heads and the MLP's width split over tp (1d) or the grid's side q,
// and a grid's micro-batch over its batch blocks (2d: q, 2.5d: d x q, 3d:
// q x q). For the planner: the layouts each mode offers for tp ranks and
// the collectives a rank issues per block. Torch-free, in
// libkolos_plugin_terms.
#include <cmath>
#include <string>
#include <vector>

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

// The layouts each mode offers for tp ranks: 1d any, the grids a square
// (2d), d x q x q for every d from 2 (2.5d), a cube (3d), each of sides >= 2.
void offer(const LayoutQuery& mesh, const char* mode, int64_t depth,
           std::vector<LayoutQuery>& out) {
  offer_layout(mesh, "layers", mode, depth, out);
}

void one_d_layouts(const LayoutQuery& mesh, std::vector<LayoutQuery>& out) {
  offer(mesh, "1d", 1, out);
}

void two_d_layouts(const LayoutQuery& mesh, std::vector<LayoutQuery>& out) {
  if (exact_root(mesh.tp, 2) >= 2) offer(mesh, "2d", 1, out);
}

void two_and_half_d_layouts(const LayoutQuery& mesh, std::vector<LayoutQuery>& out) {
  for (int64_t d = 2; d * 4 <= mesh.tp; ++d) {
    if (mesh.tp % d == 0 && exact_root(mesh.tp / d, 2) >= 2) offer(mesh, "2.5d", d, out);
  }
}

void three_d_layouts(const LayoutQuery& mesh, std::vector<LayoutQuery>& out) {
  if (exact_root(mesh.tp, 3) >= 2) offer(mesh, "3d", 1, out);
}

// tp1d: per block two all-reduces of the rank's [b, s/sp, h] activations
// forward (after attention's and the MLP's row layers) and two backward
// (the column layers' input gradients); the embedding's forward and the
// head's backward one each, and a GPT's position table's forward one more.
//
// Under Megatron sequence parallelism (sequence plugin "megatron") each of
// those becomes two collectives of the same bytes: the column layers'
// inputs are all-gathered forward (reduce-scattered backward) and the row
// layers' outputs reduce-scattered forward (all-gathered backward); the
// embeddings' outputs (tokens, and a GPT's positions) are reduce-scattered,
// the head's input all-gathered.
// And every parameter a sequence-split layer reads whole (tp1d.cpp
// whole(): the norms' weights and biases, the row layers' biases) has its
// gradient all-reduced over the group in backward, one call per
// parameter and micro-batch: six per block and two at the final norm (a
// LLaMA, without biases: its two RMSNorm weights, and one). Those are
// small, but each is one more collective to wait for.
void one_d_traffic(const MemoryQuery& q, std::vector<CollectiveCall>& out) {
  if (q.tp <= 1) return;
  const ModelDims& m = q.model;
  CollectiveCall c;
  c.bytes = q.element_bytes * static_cast<double>(q.micro_batch) * m.seq /
            static_cast<double>(q.sp) * m.hidden;
  c.n = q.tp, c.stride = 1;
  // A GPT's position table is a vocabulary-parallel embedding too, its
  // output [s, h] (every sequence of the micro-batch adds the same rows).
  CollectiveCall positions = c;
  positions.site = CallSite::kEmbedding;
  positions.bytes = q.element_bytes * m.seq / static_cast<double>(q.sp) * m.hidden;
  positions.count = 1;
  if (q.sequence != "megatron") {
    c.op = Collective::kAllReduce;
    c.count = 2;
    out.push_back(c);
    c.backward = true;
    out.push_back(c);
    c.count = 1;
    c.site = CallSite::kHead;
    out.push_back(c);
    c.site = CallSite::kEmbedding, c.backward = false;
    out.push_back(c);
    if (!m.llama) out.push_back(positions);
    return;
  }
  c.count = 2;
  for (const bool backward : {false, true}) {
    c.backward = backward;
    c.op = Collective::kAllGather;
    out.push_back(c);
    c.op = Collective::kReduceScatter;
    out.push_back(c);
  }
  c.count = 1;
  c.site = CallSite::kHead;
  c.op = Collective::kAllGather, c.backward = false;
  out.push_back(c);
  c.op = Collective::kReduceScatter, c.backward = true;
  out.push_back(c);
  c.site = CallSite::kEmbedding;
  c.op = Collective::kReduceScatter, c.backward = false;
  out.push_back(c);
  c.op = Collective::kAllGather, c.backward = true;
  out.push_back(c);
  if (!m.llama) {
    positions.op = Collective::kReduceScatter;
    out.push_back(positions);
    positions.op = Collective::kAllGather, positions.backward = true;
    out.push_back(positions);
  }
  // The whole parameters' gradients.
  CollectiveCall g;
  g.op = Collective::kAllReduce;
  g.bytes = q.element_bytes * m.hidden;
  g.n = q.tp, g.stride = 1;
  g.backward = true;
  g.count = m.llama ? 2 : 6;
  out.push_back(g);
  g.site = CallSite::kHead, g.count = m.llama ? 1 : 2;
  out.push_back(g);
}

// The grids' traffic per block, term by term as tests/support/tp_volume.h
// counts it: each layer gathers its input over the grid's row (unless it
// has it), its weight and bias over the batch blocks (3d: reduce-scatters
// its output over the row), each norm all-reduces its statistics over the
// row. A differentiable gather or scatter runs the opposite collective in
// backward, of the same bytes. `side`: the grid's q; `batch_blocks`: 2d q,
// 2.5d d x q, 3d q x q. Sub-groups (row-major grid, last index fastest):
// 2d/2.5d rows stride 1, batch blocks stride q; 3d (i, j, l) l 1, j q, i q².
void grid_traffic(const MemoryQuery& q, int64_t side, int64_t batch_blocks, bool three,
                  std::vector<CollectiveCall>& out) {
  const ModelDims& m = q.model;
  const double e = q.element_bytes, b = static_cast<double>(q.micro_batch), s = m.seq;
  const double h = m.hidden, f = m.inner;
  const double dq = static_cast<double>(side), dnb = static_cast<double>(batch_blocks);
  const auto call = [&](Collective op, double bytes, int64_t n, int64_t stride, double count) {
    CollectiveCall c;
    c.op = op, c.bytes = bytes, c.n = n, c.stride = stride, c.count = count;
    c.sync = SyncPattern::kGrid, c.span = q.tp;
    out.push_back(c);
    c.backward = true;
    out.push_back(c);
  };
  // Forward and its opposite in backward.
  const auto gather2 = [&](double local, int64_t n, int64_t stride) {
    call(Collective::kAllGather, static_cast<double>(n) * local * e, n, stride, 1);
  };
  const auto scatter2 = [&](double input, int64_t n, int64_t stride) {
    call(Collective::kReduceScatter, input * e, n, stride, 1);
  };
  const int64_t sF = 1, sB = side;
  const double rows = b / dnb * s;
  const auto linear = [&](double in, double width, bool input_ready) {
    if (!three) {
      if (!input_ready) gather2(rows * in / dq, side, sF);
      gather2(std::ceil(width / dq / dnb) * in, batch_blocks, sB);
      gather2(std::ceil(width / dq / dnb), batch_blocks, sB);
    } else {
      if (!input_ready) gather2(b / (dq * dq) * s * in / dq, side, side);
      gather2(std::ceil(width / dq / dq) * in / dq, side, side * side);
      scatter2(b / dq * s * width / dq, side, 1);
      gather2(std::ceil(width / (dq * dq)), side * side, 1);
    }
  };
  // Four all-reduces of a norm's statistics over the row: two forward, two
  // backward.
  const auto norm = [&](double dim) {
    call(Collective::kAllReduce, rows * e, side, sF, 2);
    gather2(std::ceil(dim / dq / dnb), batch_blocks, sB);
    gather2(std::ceil(dim / dq / dnb), batch_blocks, sB);
  };
  norm(h);
  if (!three) {
    gather2(rows * h / dq, side, sF);
  } else {
    gather2(b / (dq * dq) * s * h / dq, side, side);
  }
  for (int i = 0; i < 3; ++i) linear(h, h, true);
  linear(h, h, false);
  norm(h);
  linear(h, f, false);
  linear(f, h, false);
}

void two_d_traffic(const MemoryQuery& q, std::vector<CollectiveCall>& out) {
  const int64_t side = exact_root(q.tp, 2);
  grid_traffic(q, side, side, false, out);
}

void two_and_half_d_traffic(const MemoryQuery& q, std::vector<CollectiveCall>& out) {
  const int64_t d = std::stoll(q.setting("parallel.tensor.depth", "1"));
  const int64_t side = exact_root(q.tp / d, 2);
  grid_traffic(q, side, side * d, false, out);
}

void three_d_traffic(const MemoryQuery& q, std::vector<CollectiveCall>& out) {
  const int64_t side = exact_root(q.tp, 3);
  grid_traffic(q, side, side * side, true, out);
}

PluginTerms terms(const char* name, const char* mode, TensorCut (*cut)(const MemoryQuery&),
                  std::string (*problem)(const LayoutQuery&),
                  void (*layouts)(const LayoutQuery&, std::vector<LayoutQuery>&),
                  void (*traffic)(const MemoryQuery&, std::vector<CollectiveCall>&)) {
  PluginTerms t = layout_plugin_terms(name, "layers", mode, problem, layouts, traffic);
  t.cut = cut;
  return t;
}

}  // namespace

KOLOS_PLUGIN_TERMS(terms("tp1d", "1d", one_d, one_d_layout, one_d_layouts, one_d_traffic));
KOLOS_PLUGIN_TERMS(terms("tp2d", "2d", grid, two_d_layout, two_d_layouts, two_d_traffic));
KOLOS_PLUGIN_TERMS(terms("tp2p5d", "2.5d", grid, two_and_half_d_layout, two_and_half_d_layouts,
                         two_and_half_d_traffic));
KOLOS_PLUGIN_TERMS(terms("tp3d", "3d", grid, three_d_layout, three_d_layouts, three_d_traffic));

}  // namespace kolos
