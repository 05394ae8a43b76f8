// dp's terms (kolos/core/plugin_terms.h): every rank keeps the whole
// model's states and all-reduces its gradients once a step. Torch-free, in
// libkolos_plugin_terms.
#include "kolos/core/format.h"
#include "kolos/core/plugin_terms.h"

namespace kolos {
namespace {

void dp_states(const MemoryQuery& q, const RankPiece& p, std::vector<MemoryTerm>& out) {
  const double e = q.element_bytes, masters = q.mixed() ? 4 : 0;
  out.push_back(
      {"parameters", e * p.params, p.count() + " x " + std::to_string(static_cast<int>(e)) + " B"});
  out.push_back({"gradients", e * p.params, "whole, in the bucket engine's buffers"});
  out.push_back({"optimizer states", (8 + masters) * p.params,
                 std::string("AdamW m, v (fp32)") + (q.mixed() ? " + fp32 masters" : "")});
}

// The gradients all-reduced over dp x sp (stride tp) from the backward's
// hooks, bucket by bucket: hidden behind the backward as far as it goes.
void dp_traffic(const MemoryQuery& q, double bytes, std::vector<CollectiveCall>& out) {
  if (q.dp * q.sp <= 1) return;
  CollectiveCall c;
  c.op = Collective::kAllReduce, c.bytes = bytes, c.n = q.dp * q.sp, c.stride = q.tp;
  c.site = CallSite::kStep, c.backward = true, c.hides = Hides::kPass;
  out.push_back(c);
}

PluginTerms dp_terms() {
  PluginTerms t;
  t.name = "dp", t.role = "gradients";
  t.states = dp_states, t.gradient_traffic = dp_traffic;
  return t;
}

}  // namespace

KOLOS_PLUGIN_TERMS(dp_terms());

}  // namespace kolos
