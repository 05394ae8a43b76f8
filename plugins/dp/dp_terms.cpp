// dp's memory terms (kolos/core/plugin_terms.h): every rank keeps the whole
// model's states. Torch-free, in libkolos_plugin_terms.
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

}  // namespace

KOLOS_PLUGIN_TERMS(PluginTerms{"dp", "gradients", nullptr, nullptr, nullptr, dp_states});

}  // namespace kolos
