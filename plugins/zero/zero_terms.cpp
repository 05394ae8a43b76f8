// ZeRO's memory terms (kolos/core/plugin_terms.h). Stages shard over the
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

PluginTerms zero3_terms() {
  PluginTerms t{"zero3", "gradients", nullptr, nullptr, nullptr, zero3_states};
  t.built = zero3_built;
  return t;
}

}  // namespace

KOLOS_PLUGIN_TERMS(PluginTerms{"zero1", "gradients", nullptr, nullptr, nullptr, zero1_states});
KOLOS_PLUGIN_TERMS(PluginTerms{"zero2", "gradients", nullptr, nullptr, nullptr, zero2_states});
KOLOS_PLUGIN_TERMS(zero3_terms());

}  // namespace kolos
