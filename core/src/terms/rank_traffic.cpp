// What the planner asks the plugins besides memory (kolos/core/plugin_terms.h):
// the layouts they offer and the collectives they issue. The planner's cost
// model times the calls; nothing here knows a plugin by name.
#include <string>
#include <vector>

#include "kolos/core/plugin_terms.h"

namespace kolos {

double CollectiveCall::sent() const {
  const double dn = static_cast<double>(n);
  double one = 0;
  switch (op) {
    case Collective::kAllReduce:
      one = 2 * (dn - 1) / dn * bytes;  // a ring's reduce-scatter and all-gather
      break;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      one = (dn - 1) / dn * bytes;
      break;
    case Collective::kSendRecv:
      one = bytes;
      break;
  }
  return count * one;
}

PluginTerms layout_plugin_terms(const std::string& name, const std::string& role,
                                const std::string& mode, std::string (*problem)(const LayoutQuery&),
                                void (*layouts)(const LayoutQuery&, std::vector<LayoutQuery>&),
                                void (*traffic)(const MemoryQuery&, std::vector<CollectiveCall>&)) {
  PluginTerms t;
  t.name = name, t.role = role, t.mode = mode;
  t.layout_problem = problem, t.layouts = layouts, t.traffic = traffic;
  return t;
}

void offer_layout(const LayoutQuery& mesh, const std::string& role, const char* mode,
                  int64_t variant, std::vector<LayoutQuery>& out) {
  LayoutQuery l = mesh;
  if (role == "sequence") {
    l.sequence_mode = mode, l.ulysses = variant;
  } else {
    l.tensor_mode = mode, l.depth = variant;
  }
  out.push_back(l);
}

std::vector<LayoutQuery> offered_layouts(const std::string& role, const LayoutQuery& mesh) {
  std::vector<LayoutQuery> out;
  for (const std::string& name : plugin_terms_names()) {
    const PluginTerms* t = plugin_terms(name);
    if (t->role == role && t->layouts != nullptr) t->layouts(mesh, out);
  }
  return out;
}

std::vector<CollectiveCall> plugin_traffic(const std::string& name, const MemoryQuery& q,
                                           bool* priced) {
  std::vector<CollectiveCall> out;
  const PluginTerms* t = name.empty() ? nullptr : plugin_terms(name);
  if (t != nullptr && t->traffic != nullptr) t->traffic(q, out);
  if (priced != nullptr) *priced = name.empty() || (t != nullptr && t->traffic != nullptr);
  return out;
}

std::vector<CollectiveCall> gradient_traffic(const MemoryQuery& q, double parameter_bytes,
                                             bool* priced) {
  std::vector<CollectiveCall> out;
  const PluginTerms* t = q.gradients.empty() ? nullptr : plugin_terms(q.gradients);
  const bool hook = t != nullptr && t->gradient_traffic != nullptr;
  if (hook) t->gradient_traffic(q, parameter_bytes, out);
  if (priced != nullptr) *priced = hook;
  return out;
}

double optimizer_share(const MemoryQuery& q) {
  const PluginTerms* t = q.gradients.empty() ? nullptr : plugin_terms(q.gradients);
  return t != nullptr && t->optimizer_share != nullptr ? t->optimizer_share(q) : 1.0;
}

AttentionMemory attention_memory(const MemoryQuery& q, double micro, double tokens) {
  const PluginTerms* t = q.sequence.empty() ? nullptr : plugin_terms(q.sequence);
  return t != nullptr && t->attention != nullptr ? t->attention(q, micro, tokens)
                                                 : dense_attention_memory(q, micro, tokens);
}

double boundary_split(const MemoryQuery& q) {
  const double tokens = q.model.seq / static_cast<double>(q.sp);
  if (attention_memory(q, static_cast<double>(q.micro_batch), tokens).norms_over_tensor) {
    return static_cast<double>(q.tp);
  }
  const PluginTerms* t = q.layers.empty() ? nullptr : plugin_terms(q.layers);
  return t != nullptr && t->cut != nullptr ? t->cut(q).norms : 1.0;
}

}  // namespace kolos
