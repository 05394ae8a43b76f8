// Per-rank memory, estimated from the configuration before anything is
// allocated: the model's shape, the mesh, the chosen plugins, the precision
// and the micro-batch. The engine refuses a run whose estimate exceeds the
// rank's budget (node memory or [runtime] memory_limit) before it builds the
// model; `kolos check` does the same and `kolos plan --memory` prints the
// table. docs/reliability.md describes the model of each term and how close
// it comes to the measured peak.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kolos/core/mesh_layout.h"
#include "kolos/core/plugin_terms.h"
#include "kolos/core/roles.h"
#include "kolos/core/run_config.h"

namespace kolos {

struct MemoryEstimate {
  MeshShape shape;
  RoleChoice roles;
  int64_t accumulation = 1;
  std::string rank;  // which rank the figures are for ("pipeline stage 0")
  // Steady-state terms, the worst rank; their sum is the training peak.
  std::vector<MemoryTerm> terms;
  // Peak while the model is built (whole local parameters, or what a
  // plugin that builds into place keeps, plus the largest initialisation
  // temporaries, plus the runtime).
  double build_peak = 0;
  std::string build_detail;  // what the build peak holds, for the table
  double training_peak() const;
  double peak() const;  // max(training, build)
  const MemoryTerm& largest() const;
  // Total parameters of the model (all ranks together).
  double model_parameters = 0;
};

// What a rank may use, and where that figure comes from.
struct MemoryBudget {
  double bytes = 0;
  std::string source;  // "[runtime] memory_limit", "MemAvailable 21.3 GiB / 2 ranks on this node"
};

// The estimate for `world_size` ranks. `runtime_bytes`: what the process
// holds before the model exists (LibTorch, MPI, plugins); the caller
// measures it (resident_bytes()). Throws ConfigError when the mesh does not
// fit the world (resolve_mesh_shape's message).
MemoryEstimate estimate_memory(const RunConfig& config, int64_t world_size, double runtime_bytes);
// The run as rank_memory() (plugin_terms.h) takes it: what estimate_memory
// asks, and what a test compares the planner's query with.
MemoryQuery memory_query(const RunConfig& config, int64_t world_size, double runtime_bytes);
// The keys of every role's section as text, by their full names
// ("memory.compute_budget"): what the plugins' terms read.
std::map<std::string, std::string> role_settings(const RunConfig& config);

// The ranks of the mesh's axes other than data: pipeline x sequence x
// tensor (sequence mode "megatron" adds no axis: it splits over the tensor
// group). The fewest ranks a config fits are this times max(data, 1).
int64_t non_data_ranks(const RunConfig& config);
// The fewest ranks the config's mesh fits (what `kolos check` plans at):
// parallel.data (else the expert axis's size, else 1) x non_data_ranks.
int64_t fewest_ranks(const RunConfig& config);

// The budget of one rank when `ranks_per_node` ranks share this machine:
// [runtime] memory_limit when set, else the node's available memory (the
// smaller of /proc/meminfo's MemAvailable and a cgroup limit) divided by the
// ranks, plus what this process already holds.
MemoryBudget memory_budget(const RunConfig& config, int64_t ranks_per_node);

// Ranks of the job on this machine, from the launcher's environment
// (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE);
// `world_size` when none says.
int64_t ranks_on_this_node(int64_t world_size);

// Resident bytes of this process now (/proc/self/statm).
double resident_bytes();

// Throws ConfigError when the estimate exceeds the budget: the numbers, the
// largest term and what would fit (zero3, tensor or pipeline parallelism, a
// smaller micro-batch, more ranks), each with its estimate.
void check_memory_fits(const RunConfig& config, const MemoryEstimate& estimate,
                       const MemoryBudget& budget, int64_t world_size);

// The table `kolos plan --memory` prints.
std::string format_memory_table(const MemoryEstimate& estimate, const MemoryBudget& budget);

}  // namespace kolos
