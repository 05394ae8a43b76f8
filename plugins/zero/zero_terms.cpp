// ZeRO's terms (kolos/core/plugin_terms.h): memory and, for the planner,
// the collectives of each stage. Stages shard over the
// data-parallel group dp x sp (ranks of one sequence group hold the same
// parameters): 1 the optimizer's states, 2 also the gradients, 3 also the
// parameters. Torch-free, in libkolos_plugin_terms.
#include <algorithm>

#include "kolos/core/plugin_terms.h"

namespace kolos {
namespace {

double shards(const MemoryQuery& q) { return static_cast<double>(q.dp * q.sp); }

std::string over(const MemoryQuery& q) { return " / dp x sp " + std::to_string(q.dp * q.sp); }

// AdamW's m and v (fp32), under bf16/fp16 the fp32 masters, and stages 1
// and 2's working copy of the parameter shard in the parameters' dtype.
void optimizer(const MemoryQuery& q, const RankPiece& p, bool working_copy,
               std::vector<MemoryTerm>& out) {
  const double e = q.element_bytes, masters = q.mixed() ? 4 : 0;
  out.push_back({"optimizer states", (8 + (working_copy ? e : 0) + masters) * p.params / shards(q),
                 std::string("AdamW m, v (fp32)") +
                     (working_copy ? ", the working copy of the shard" : "") +
                     (q.mixed() ? " + fp32 masters" : "") + over(q)});
}

void zero1_states(const MemoryQuery& q, const RankPiece& p, std::vector<MemoryTerm>& out) {
  const double e = q.element_bytes;
  out.push_back({"parameters", e * p.params, p.count() + " whole"});
  out.push_back({"gradients", e * p.params, "whole, in the bucket engine's buffers"});
  optimizer(q, p, /*working_copy=*/true, out);
}

void zero2_states(const MemoryQuery& q, const RankPiece& p, std::vector<MemoryTerm>& out) {
  const double e = q.element_bytes;
  out.push_back({"parameters", e * p.params, p.count() + " whole"});
  out.push_back({"gradients", e * p.params / shards(q) + std::min(q.bucket_bytes, e * p.params),
                 "shard + one bucket of staging"});
  optimizer(q, p, /*working_copy=*/true, out);
}

void zero3_states(const MemoryQuery& q, const RankPiece& p, std::vector<MemoryTerm>& out) {
  const double e = q.element_bytes;
  out.push_back({"parameters", e * (p.params / shards(q) + 2 * p.block),
                 p.count() + over(q) + " + 2 blocks gathered"});
  out.push_back({"gradients", e * (p.params / shards(q) + 2 * p.block),
                 "shard + one block of staging and of .grad"});
  optimizer(q, p, /*working_copy=*/false, out);
}

// Stage 3 builds the model into place: this rank's rows of every
// parameter, and the block being built whole in fp32 (as initialised).
double zero3_built(const MemoryQuery& q, const RankPiece& p) {
  return q.element_bytes * p.params / shards(q) + 4 * p.block;
}

// The collectives over the group dp x sp (stride tp) of `bytes`, with
// `copy` bytes read and written locally per byte (CollectiveCall::copy).
CollectiveCall over_group(const MemoryQuery& q, Collective op, double bytes, CallSite site,
                          bool backward, Hides hides, double copy) {
  CollectiveCall c;
  c.op = op, c.bytes = bytes, c.n = q.dp * q.sp, c.stride = q.tp;
  c.site = site, c.backward = backward, c.hides = hides, c.copy = copy;
  return c;
}

// The local copies around each call, per byte of the whole buffer (the
// parameters' or the gradients' bytes):
// - a gather's rows unpacked into the parameters: read and written once;
constexpr double kGatherCopy = 2;
// - a micro-batch's gradients packed into a staging buffer zeroed for it
//   (zero.cpp scatter_rows, grad_buckets.cpp: written, then read and
//   written), and the reduced shard (1/n of it) added to the shard's
//   gradient (read twice, written).
double scatter_copy(const MemoryQuery& q) { return 3 + 3.0 / static_cast<double>(q.dp * q.sp); }

// Stage 1: the gradients all-reduced from the backward's hooks (hidden
// behind it), the updated shards all-gathered after the optimizer.
void zero1_traffic(const MemoryQuery& q, double bytes, std::vector<CollectiveCall>& out) {
  if (q.dp * q.sp <= 1) return;
  out.push_back(
      over_group(q, Collective::kAllReduce, bytes, CallSite::kStep, true, Hides::kPass, 0));
  out.push_back(over_group(q, Collective::kAllGather, bytes, CallSite::kStep, false,
                           Hides::kNothing, kGatherCopy));
}

// Stage 2: each micro-batch's gradients reduce-scattered in its backward;
// the shards all-gathered after the optimizer.
void zero2_traffic(const MemoryQuery& q, double bytes, std::vector<CollectiveCall>& out) {
  if (q.dp * q.sp <= 1) return;
  out.push_back(over_group(q, Collective::kReduceScatter, bytes, CallSite::kMicroBatch, true,
                           Hides::kPass, scatter_copy(q)));
  out.push_back(over_group(q, Collective::kAllGather, bytes, CallSite::kStep, false,
                           Hides::kNothing, kGatherCopy));
}

// Stage 3: each micro-batch gathers the parameters before forward and
// again before backward, and reduce-scatters the gradients.
void zero3_traffic(const MemoryQuery& q, double bytes, std::vector<CollectiveCall>& out) {
  if (q.dp * q.sp <= 1) return;
  const CallSite micro = CallSite::kMicroBatch;
  out.push_back(
      over_group(q, Collective::kAllGather, bytes, micro, false, Hides::kPass, kGatherCopy));
  out.push_back(
      over_group(q, Collective::kAllGather, bytes, micro, true, Hides::kPass, kGatherCopy));
  out.push_back(
      over_group(q, Collective::kReduceScatter, bytes, micro, true, Hides::kPass, scatter_copy(q)));
}

// Each rank steps its shard of the optimizer.
double sharded(const MemoryQuery& q) { return 1 / shards(q); }

PluginTerms terms(const char* name,
                  void (*states)(const MemoryQuery&, const RankPiece&, std::vector<MemoryTerm>&),
                  void (*traffic)(const MemoryQuery&, double, std::vector<CollectiveCall>&)) {
  PluginTerms t;
  t.name = name, t.role = "gradients";
  t.states = states, t.gradient_traffic = traffic, t.optimizer_share = sharded;
  return t;
}

PluginTerms zero3_terms() {
  PluginTerms t = terms("zero3", zero3_states, zero3_traffic);
  t.built = zero3_built;
  return t;
}

}  // namespace

KOLOS_PLUGIN_TERMS(terms("zero1", zero1_states, zero1_traffic));
KOLOS_PLUGIN_TERMS(terms("zero2", zero2_states, zero2_traffic));
KOLOS_PLUGIN_TERMS(zero3_terms());

}  // namespace kolos
