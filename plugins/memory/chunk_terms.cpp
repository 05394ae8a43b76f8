// The chunks plugin's memory terms (kolos/core/plugin_terms.h). It keeps
// parameters, gradients and AdamW's moments (fp32) in chunks: at most
// memory.compute_budget of them in the compute tier, every chunk's copy in
// host memory unless memory.offload = "nvme". Parameters and gradients in
// the run's dtype; m, v and (bf16/fp16) the masters in fp32, spread over
// dp x sp under parallel.zero.stage >= 1, and the parameters too under
// stage 3. Gradient chunks of other ranks' indices take no tier copy with
// one micro-batch per step (they stay resident from their first use to
// their reduction, but for a chunk blocks far apart read, such as a tied
// embedding's, which a tight budget may evict in between: not counted);
// with several, every rank may hold every gradient chunk. Torch-free, in
// libkolos_plugin_terms.
#include <stdexcept>

#include "kolos/core/format.h"
#include "kolos/core/plugin_terms.h"
#include "kolos/core/settings.h"

namespace kolos {
namespace {

void chunk_states(const MemoryQuery& q, const RankPiece& p, std::vector<MemoryTerm>& out) {
  double budget = 0;
  try {
    budget = static_cast<double>(parse_byte_size(q.setting("memory.compute_budget", "0")));
  } catch (const std::exception&) {
  }  // the plugin refuses it, with the key's place
  const std::string offload = q.setting("memory.offload", "host");
  out.push_back({"chunks, compute tier", budget,
                 "memory.compute_budget: parameters, gradients, AdamW m and v resident"});
  const double e = q.element_bytes;
  const double shards = q.zero_stage >= 1 ? static_cast<double>(q.dp * q.sp) : 1.0;
  const double optim = (8 + (q.mixed() ? 4 : 0)) / shards;
  const bool grads_sharded = shards > 1 && q.accumulation == 1;
  const double per_param =
      (q.zero_stage == 3 ? e / shards : e) + (grads_sharded ? e / shards : e) + optim;
  const std::string sharded = q.zero_stage == 3 ? "parameter, " : "";
  if (offload == "nvme") {
    out.push_back({"chunks, host tier", 0, "on NVMe (memory.offload = \"nvme\")", true});
    return;
  }
  out.push_back({"chunks, host tier", per_param * p.params,
                 "every chunk's copy: " + p.count() + " x " + detail::format_count(per_param) +
                     " B" +
                     (shards == 1     ? ""
                      : grads_sharded ? " (" + sharded + "gradient and optimizer chunks / dp x sp)"
                                      : " (" + sharded + "optimizer chunks / dp x sp)"),
                 /*host=*/true});
}

// The model is built into place: the block being built, whole in fp32 (as
// initialised); the rest waits in a file until the chunks take it.
double chunks_built(const MemoryQuery&, const RankPiece& p) { return 4 * p.block; }

PluginTerms chunk_terms() {
  PluginTerms t{"chunks", "memory", nullptr, nullptr, nullptr, chunk_states};
  t.built = chunks_built;
  return t;
}

}  // namespace

KOLOS_PLUGIN_TERMS(chunk_terms());

}  // namespace kolos
