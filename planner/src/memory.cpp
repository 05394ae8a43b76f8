// Memory per rank of a Candidate: the candidate described as a MemoryQuery
// for rank_memory() (kolos/core/plugin_terms.h), the function the core's
// estimate calls for a config. The plugins are those kolos would choose for
// the candidate's settings (choose_plugins in roles.h); the planner names
// none itself.
#include <algorithm>
#include <string>

#include "kolos/core/plugin_terms.h"
#include "kolos/core/roles.h"
#include "kolos/planner/cost_model.h"

namespace kolos::planner {

RoleChoice plugins_of(const Candidate& c, bool memory_role) {
  RoleSettings roles;
  roles.tensor_size = c.tp;
  roles.tensor_mode = c.tp_mode;
  roles.sequence_size = c.sp;
  roles.sequence_mode = c.sp_mode;
  roles.pipeline_size = c.pp;
  roles.zero_stage = c.zero;
  roles.memory = memory_role || c.offload > 0;
  return choose_plugins(roles);
}

MemoryQuery memory_query(const Workload& w, const Candidate& c, double runtime_bytes) {
  const ModelShape& m = w.model;
  MemoryQuery q;
  q.model.layers = static_cast<double>(m.layers);
  q.model.hidden = static_cast<double>(m.hidden);
  q.model.heads = static_cast<double>(m.heads);
  q.model.kv_heads = static_cast<double>(m.kv());
  q.model.seq = static_cast<double>(m.seq_len);
  q.model.vocab = static_cast<double>(m.vocab);
  q.model.inner = static_cast<double>(m.ffn());
  q.pp = c.pp, q.dp = c.dp, q.sp = c.sp, q.tp = c.tp;
  const RoleChoice plugins = plugins_of(c, w.memory_role);
  q.layers = plugins.layers, q.sequence = plugins.sequence, q.pipeline = plugins.pipeline;
  q.gradients = plugins.gradients;  // q.memory below, once the states are known
  q.settings = w.settings;
  // The layouts' variants, for the plugins that read them.
  q.settings["parallel.tensor.depth"] = std::to_string(c.tp_depth);
  q.settings["parallel.sequence.ulysses"] = std::to_string(c.ulysses);
  if (c.pp > 1) {
    q.settings["parallel.pipeline.schedule"] = to_string(c.schedule);
    q.settings["parallel.pipeline.chunks"] = std::to_string(c.chunks);
  }
  q.element_bytes = w.element_bytes();
  q.micro_batch = c.micro_batch;
  q.accumulation = c.microbatches;
  q.recompute = to_string(c.recompute);
  q.zero_stage = c.zero;
  q.bucket_bytes = w.bucket_bytes;
  q.recompute_every = w.recompute_every;
  q.runtime_bytes = runtime_bytes;
  q.heap_tuned = w.heap_tuned;
  q.runtime_source = "the cluster file's runtime_bytes";
  q.details = false;  // the planner reads the bytes alone
  if (w.memory_role) {
    q.memory = plugins.memory;
  } else if (c.offload > 0) {
    // The memory role keeps (1 - offload) of the model states in the
    // compute tier: its budget, from the states the gradients role holds.
    const double states = rank_memory(q).states;
    q.memory = plugins.memory;
    q.settings["memory.compute_budget"] =
        std::to_string(static_cast<long long>((1 - c.offload) * states));
  }
  return q;
}

namespace {

double rank_bytes(const RankMemory& r, bool host_is_device, std::vector<MemoryPart>* parts,
                  double* host_bytes) {
  if (parts != nullptr) {
    parts->clear();
    for (const auto& t : r.terms) {
      if (host_is_device || !t.host) parts->push_back({t.name, t.bytes});
    }
  }
  if (host_bytes != nullptr) *host_bytes = r.host();
  return host_is_device ? r.peak() : std::max(r.training_peak() - r.host(), r.build_peak);
}

}  // namespace

double memory_per_rank(const Workload& w, const Candidate& c, std::vector<MemoryPart>* parts,
                       double runtime_bytes, double* host_bytes) {
  return rank_bytes(rank_memory(memory_query(w, c, runtime_bytes)), false, parts, host_bytes);
}

double memory_per_rank(const Workload& w, const Candidate& c, const Cluster& cluster,
                       std::vector<MemoryPart>* parts, double* host_bytes) {
  return memory_per_rank(memory_query(w, c, cluster.runtime_bytes), cluster, parts, host_bytes);
}

double memory_per_rank(const MemoryQuery& q, const Cluster& cluster, std::vector<MemoryPart>* parts,
                       double* host_bytes) {
  return rank_bytes(rank_memory(q), cluster.host_is_device, parts, host_bytes);
}

}  // namespace kolos::planner
