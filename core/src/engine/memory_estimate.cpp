// Per-rank memory estimate (memory_estimate.h): the run described as a
// MemoryQuery for rank_memory() (plugin_terms.h), which adds the model's
// terms and asks each chosen plugin for its own; the planner calls the same
// function. What this file adds: the query from a RunConfig, the budget,
// what would fit instead, and the table.
#include "kolos/core/memory_estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "kolos/core/error.h"
#include "kolos/core/format.h"
#include "kolos/core/malloc_tuning.h"
#include "kolos/core/sequence_modes.h"
#include "kolos/core/settings.h"

namespace kolos {

namespace {

using detail::format_bytes;

std::string fmt_count(double n) {
  std::ostringstream out;
  if (n >= 1e12) {
    out.precision(3);
    out << n;  // scientific beyond a trillion
    return out.str();
  }
  return detail::format_count(n);
}

ModelDims model_dims(const RunConfig& c) {
  const ModelConfig& m = c.model;
  ModelDims d;
  d.layers = static_cast<double>(m.layers);
  d.hidden = static_cast<double>(m.hidden);
  d.heads = static_cast<double>(m.heads);
  d.kv_heads = d.heads;
  d.seq = static_cast<double>(m.seq_len);
  d.vocab = static_cast<double>(m.vocab);
  d.inner = static_cast<double>(m.mlp_ratio * m.hidden);
  if (llama_family(m)) {
    d.llama = true;
    d.inner = static_cast<double>(m.ffn_hidden > 0 ? m.ffn_hidden : default_ffn_hidden(m.hidden));
    d.kv_heads = static_cast<double>(m.kv_heads > 0 ? m.kv_heads : m.heads);
    if (m.name == "mixtral") {  // the experts keys act on mixtral only
      int64_t moe = 0;
      for (int64_t b = 0; b < m.layers; ++b) moe += is_moe_block(m, b) ? 1 : 0;
      d.moe_share = static_cast<double>(moe) / static_cast<double>(m.layers);
      d.experts = static_cast<double>(m.experts);
      d.top_k = static_cast<double>(m.top_k);
      d.shared = static_cast<double>(m.shared_experts);
    }
  }
  return d;
}

}  // namespace

std::map<std::string, std::string> role_settings(const RunConfig& config) {
  std::map<std::string, std::string> out;
  for (const RoleSpec& spec : role_specs()) {
    const ConfigSection section = config.section(spec.section);
    if (!section.present()) continue;
    for (const std::string& key : section.keys()) {
      // Strings as their value, anything else as its TOML text.
      std::string text = section.value_text(key);
      if (!text.empty() && (text.front() == '"' || text.front() == '\'')) section.read(key, text);
      out[spec.section + "." + key] = text;
    }
  }
  return out;
}

namespace {

MemoryQuery query_of(const RunConfig& config, const MeshShape& mesh, const RoleChoice& roles,
                     int64_t accumulation, double runtime_bytes) {
  MemoryQuery q;
  q.model = model_dims(config);
  q.pp = mesh.pp, q.dp = mesh.dp, q.sp = mesh.sp, q.tp = mesh.tp;
  q.ep = std::max<int64_t>(1, config.parallel.expert.size);
  q.layers = roles.layers, q.sequence = roles.sequence, q.pipeline = roles.pipeline;
  q.gradients = roles.gradients, q.memory = roles.memory;
  q.settings = role_settings(config);
  const std::string& p = config.train.precision;
  q.element_bytes = p == "bf16" || p == "fp16" ? 2 : 4;
  q.micro_batch = config.train.micro_batch;
  q.accumulation = accumulation;
  q.recompute = config.train.recompute;
  q.recompute_every = config.train.recompute_every;
  q.zero_stage = static_cast<int>(config.parallel.zero.stage);
  q.bucket_bytes = static_cast<double>(config.parallel.bucket_kb > 0
                                           ? config.parallel.bucket_kb * 1024
                                           : config.parallel.bucket_mb * 1024 * 1024);
  q.runtime_bytes = runtime_bytes;
  q.heap_tuned = training_malloc().tuned;
  return q;
}

std::string budget_suffix(const MemoryBudget& budget) { return " (" + budget.source + ")"; }

}  // namespace

double MemoryEstimate::training_peak() const {
  double total = 0;
  for (const auto& t : terms) total += t.bytes;
  return total;
}

double MemoryEstimate::peak() const { return std::max(training_peak(), build_peak); }

const MemoryTerm& MemoryEstimate::largest() const {
  return *std::max_element(terms.begin(), terms.end(),
                           [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes < b.bytes; });
}

int64_t fewest_ranks(const RunConfig& config) {
  const int64_t data = config.parallel.data > 0 ? config.parallel.data : config.parallel.expert.size;
  return std::max<int64_t>(data, 1) * non_data_ranks(config);
}

int64_t non_data_ranks(const RunConfig& config) {
  const auto& p = config.parallel;
  return p.pipeline.size * sequence_axis_size(p.sequence) * p.tensor.size;
}

namespace {

// Micro-batches per step on each rank.
int64_t accumulation_of(const RunConfig& config, const MeshShape& mesh) {
  const int64_t per_step = config.train.micro_batch * mesh.batch_ranks();
  return std::max<int64_t>(1, config.train.global_batch / std::max<int64_t>(1, per_step));
}

}  // namespace

MemoryQuery memory_query(const RunConfig& config, int64_t world_size, double runtime_bytes) {
  const MeshShape mesh = resolve_mesh_shape(config, world_size);
  return query_of(config, mesh, choose_plugins(config), accumulation_of(config, mesh),
                  runtime_bytes);
}

namespace {

// estimate_memory, for the heap training_malloc() gives or, with `tuned_heap`,
// for the tuned one.
MemoryEstimate estimate_for_heap(const RunConfig& config, int64_t world_size, double runtime_bytes,
                                 bool tuned_heap) {
  MemoryEstimate e;
  e.shape = resolve_mesh_shape(config, world_size);
  e.roles = choose_plugins(config);
  e.accumulation = accumulation_of(config, e.shape);
  MemoryQuery q = query_of(config, e.shape, e.roles, e.accumulation, runtime_bytes);
  q.heap_tuned = q.heap_tuned || tuned_heap;
  const RankMemory r = rank_memory(q);
  e.rank = r.rank;
  e.terms = r.terms;
  e.build_peak = r.build_peak;
  e.build_detail = r.build_detail;
  e.model_parameters = r.model_parameters;
  return e;
}

}  // namespace

MemoryEstimate estimate_memory(const RunConfig& config, int64_t world_size, double runtime_bytes) {
  return estimate_for_heap(config, world_size, runtime_bytes, false);
}

int64_t ranks_on_this_node(int64_t world_size) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    char* end = nullptr;
    const long n = std::strtol(value, &end, 10);
    if (end != value && n >= 1 && n <= world_size) return n;
  }
  return world_size;
}

double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  double pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<double>(sysconf(_SC_PAGESIZE));
}

namespace {

// A number from a one-line file ("max" and unreadable files: none).
bool read_number(const std::string& path, double& out) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return false;
  try {
    out = std::stod(word);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

MemoryBudget memory_budget(const RunConfig& config, int64_t ranks_per_node) {
  MemoryBudget budget;
  if (config.runtime.memory_limit > 0) {
    budget.bytes = static_cast<double>(config.runtime.memory_limit);
    budget.source = "[runtime] memory_limit";
    return budget;
  }
  ranks_per_node = std::max<int64_t>(1, ranks_per_node);
  double available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double value = 0;
  std::string unit;
  while (meminfo >> key >> value) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") available = value * 1024;
  }
  std::string what = "MemAvailable " + format_bytes(available);
  // A container's limit (cgroup v2, then v1) when it is tighter.
  double limit = 0, used = 0;
  if ((read_number("/sys/fs/cgroup/memory.max", limit) &&
       read_number("/sys/fs/cgroup/memory.current", used)) ||
      (read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes", limit) &&
       read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes", used))) {
    if (limit < 1e18 && limit - used < available) {
      available = std::max(0.0, limit - used);
      what = "cgroup limit " + format_bytes(limit) + " - " + format_bytes(used) + " used";
    }
  }
  // What this process holds is already out of MemAvailable.
  budget.bytes = available / static_cast<double>(ranks_per_node) + resident_bytes();
  budget.source = what + " / " + std::to_string(ranks_per_node) +
                  (ranks_per_node == 1 ? " rank" : " ranks") + " on this node";
  return budget;
}

namespace {

struct Alternative {
  std::string what;
  double peak;
};

// Estimates of variants of `config` on `world` ranks that fit `budget`.
std::vector<Alternative> alternatives(const RunConfig& config, int64_t world, double runtime,
                                      double budget) {
  std::vector<Alternative> out;
  auto try_variant = [&](RunConfig variant, int64_t ranks, const std::string& what) {
    try {
      const MemoryEstimate e = estimate_memory(variant, ranks, runtime);
      if (e.peak() <= budget) out.push_back(Alternative{what, e.peak()});
      return e.peak() <= budget;
    } catch (const std::exception&) {
      return false;  // that mesh does not divide: not an alternative
    }
  };
  // The same run on the tuned heap (malloc_tuning.h), where this machine
  // would give it: a lower peak for a slower step.
  if (!training_malloc().tuned && training_malloc("tuned").tuned) {
    const MemoryEstimate e = estimate_for_heap(config, world, runtime, true);
    if (e.peak() <= budget) {
      out.push_back(Alternative{"KOLOS_MALLOC=tuned in the environment (slower steps)", e.peak()});
    }
  }
  if (config.parallel.zero.stage != 3) {
    RunConfig v = config;
    v.parallel.zero.stage = 3;
    try_variant(v, world, "parallel.zero.stage = 3");
  }
  for (int64_t tp = 2; tp <= world && tp <= 64; tp *= 2) {
    if (tp <= config.parallel.tensor.size || config.model.heads % tp != 0) continue;
    RunConfig v = config;
    v.parallel.tensor.size = tp;
    if (try_variant(v, world, "parallel.tensor.size = " + std::to_string(tp))) break;
  }
  for (int64_t pp = 2; pp <= world && pp <= 64; ++pp) {
    if (pp <= config.parallel.pipeline.size || config.model.layers % pp != 0) continue;
    RunConfig v = config;
    v.parallel.pipeline.size = pp;
    if (try_variant(v, world, "parallel.pipeline.size = " + std::to_string(pp))) break;
  }
  for (int64_t micro = config.train.micro_batch / 2; micro >= 1; micro /= 2) {
    RunConfig v = config;
    v.train.micro_batch = micro;
    if (try_variant(v, world, "train.micro_batch = " + std::to_string(micro))) break;
  }
  // More ranks with zero3: the fewest (a multiple of the non-dp axes) up to 4096.
  RunConfig v = config;
  v.parallel.zero.stage = 3;
  v.parallel.data = 0;
  const int64_t others = non_data_ranks(config);
  for (int64_t ranks = world * 2; ranks <= 4096; ranks *= 2) {
    if (ranks % others != 0) continue;
    if (try_variant(v, ranks, std::to_string(ranks) + " ranks with parallel.zero.stage = 3 (" +
                                  std::to_string(ranks / others) + "-way data parallel)")) {
      break;
    }
  }
  return out;
}

}  // namespace

void check_memory_fits(const RunConfig& config, const MemoryEstimate& estimate,
                       const MemoryBudget& budget, int64_t world_size) {
  if (estimate.peak() <= budget.bytes) return;
  const MemoryTerm& largest = estimate.largest();
  const bool building = estimate.build_peak > estimate.training_peak();
  std::ostringstream msg;
  msg << (config.source.empty() ? "<config>" : config.source) << ": the model does not fit: "
      << fmt_count(estimate.model_parameters) << " parameters need about "
      << format_bytes(estimate.peak()) << " per rank on " << world_size
      << (world_size == 1 ? " rank" : " ranks")
      << (building                           ? " (while building the model)"
          : estimate.shape.pp > 1            ? " (" + estimate.rank + ")"
                                             : std::string())
      << ", but "
      << format_bytes(budget.bytes) << " is available" << budget_suffix(budget)
      << ". Largest: " << largest.name << ", " << format_bytes(largest.bytes) << " ("
      << largest.detail << ").";
  const auto fits = alternatives(config, world_size, estimate.terms.back().bytes, budget.bytes);
  if (fits.empty()) {
    msg << " Nothing tried fits (zero3, tensor or pipeline parallelism on these ranks, a smaller "
           "micro-batch, up to 4096 ranks with zero3).";
  } else {
    msg << " Would fit:";
    for (size_t i = 0; i < fits.size(); ++i) {
      msg << (i ? ";" : "") << " " << fits[i].what << " (" << format_bytes(fits[i].peak) << ")";
    }
    msg << ".";
  }
  msg << " `kolos plan --memory` prints the table; [runtime] memory_limit sets the budget.";
  throw ConfigError(msg.str());
}

std::string format_memory_table(const MemoryEstimate& e, const MemoryBudget& budget) {
  std::ostringstream out;
  char line[256];
  auto row = [&](const std::string& name, double bytes, const std::string& detail) {
    std::snprintf(line, sizeof line, "  %-18s %12s  %s\n", name.c_str(), format_bytes(bytes).c_str(),
                  detail.c_str());
    out << line;
  };
  out << "mesh " << MeshLayout(e.shape).describe() << " | layers " << e.roles.layers << ", pipeline " << e.roles.pipeline
      << ", gradients " << e.roles.gradients
      << (e.roles.sequence.empty() ? "" : ", sequence " + e.roles.sequence)
      << (e.roles.memory.empty() ? "" : ", memory " + e.roles.memory) << " | "
      << fmt_count(e.model_parameters) << " parameters | per rank, " << e.rank << ":\n";
  for (const auto& t : e.terms) row(t.name, t.bytes, t.detail);
  row("training peak", e.training_peak(), "the sum");
  row("building peak", e.build_peak, e.build_detail);
  row("budget", budget.bytes, budget.source);
  out << (e.peak() <= budget.bytes ? "fits: " : "does not fit: ") << format_bytes(e.peak())
      << " of " << format_bytes(budget.bytes) << " per rank\n";
  return out.str();
}

}  // namespace kolos
