// The cost model: step time, memory and traffic of one Candidate on one
// cluster. Every formula is in docs/planner.md; the assumed constants are
// named here.
#pragma once

#include <string>

#include "kolos/core/plugin_terms.h"
#include "kolos/core/roles.h"
#include "kolos/planner/candidate.h"
#include "kolos/planner/cluster.h"
#include "kolos/planner/model.h"

namespace kolos::planner {

// Fraction of a backward pass that the dp/ZeRO reductions of the same
// micro-batch can hide behind (kolos launches bucket reductions from
// gradient hooks on the group's own thread): assumed, not measured.
inline constexpr double kReductionOverlap = 0.8;
// Bytes a GPU process holds before the model exists (CUDA context, NCCL,
// LibTorch): assumed.
inline constexpr double kRuntimeBytes = 2.0 * 1024 * 1024 * 1024;

struct Machine {
  Cluster cluster;
  MachineRates rates;
};

// With fewer cores than ranks, what a collective waits for its peers to be
// scheduled (kolos::SyncPattern, as the plugin that issues it says:
// kGroup by its own group's size, kGrid by the tensor group's, kRing by the
// ring's).
using SyncPattern = ::kolos::SyncPattern;
struct Sync {
  SyncPattern pattern = SyncPattern::kGroup;
  int64_t span = 0;  // the grid's or the ring's ranks (kGrid, kRing)
};

// Time of one collective of `bytes` (the whole buffer: the all-reduce's
// input, the all-gather's output, the reduce-scatter's input, the
// all-to-all's send buffer; the message for kSendRecv) over `n` ranks
// spaced `stride` apart in rank order starting at rank `first`.
double collective_time(const Machine& m, Collective op, double bytes, int64_t n, int64_t stride,
                       int64_t first = 0, Sync sync = {});
// Whether n ranks spaced `stride` apart from rank `first` span more than one node.
bool spans_nodes(const Cluster& c, int64_t n, int64_t stride, int64_t first = 0);

// kolos's own two all-reduce paths on its MPI backend ([parallel]
// allreduce, core/src/comm/hierarchical.cpp) for a group of the n
// consecutive ranks from rank 0, devices_per_node (k) on each of D nodes,
// where a node's ranks reach the other nodes through one shared link of
// k x inter_bandwidth (one NIC per node, as the namespace cluster of
// tests/cluster; inter_bandwidth is each rank's share of it):
//   flat          one ring over the n ranks in rank order: 2(n-1) steps at
//                 the slower latency, 2(n-1)/n x B through the slowest hop
//                 (the one crossing nodes uses the whole node link; every
//                 other hop stays inside a node).
//   hierarchical  reduce onto the node's leader (a reduce-scatter and a
//                 gather over k: 2(k-1) intra steps, 2(k-1)/k x B), ring
//                 all-reduce of the whole B among the D leaders over the
//                 node link, broadcast inside the node (a scatter and an
//                 all-gather: 2(k-1)/k x B).
// Neither term counts the CPU time of the sums and copies, nor ranks
// waiting for a core (they are pure alpha-beta figures). Not used by
// predict(), which costs a group across nodes as NCCL's hierarchy (one NIC
// per device); docs/planner.md.
struct AllReducePaths {
  double flat = 0, hierarchical = 0;
};
AllReducePaths mpi_all_reduce_paths(const Cluster& c, double bytes, int64_t n);

// The plugins kolos chooses for the candidate's settings (choose_plugins,
// kolos/core/roles.h); the memory role's when the run has one or the
// candidate offloads.
RoleChoice plugins_of(const Candidate& c, bool memory_role = false);

// The candidate as the memory estimate's query (kolos/core/plugin_terms.h):
// the plugins kolos chooses for its settings, the pipeline's schedule, the
// memory role's compute budget for an offload fraction (that share of the
// model states leaves the device).
MemoryQuery memory_query(const Workload& w, const Candidate& c,
                         double runtime_bytes = kRuntimeBytes);
// Device memory per rank at the peak, worst pipeline stage, with its
// parts: rank_memory() over memory_query(), the function kolos's own
// estimate calls for a config, less the terms held in host memory (the
// memory role's host tier), which go to `host_bytes`.
double memory_per_rank(const Workload& w, const Candidate& c, std::vector<MemoryPart>* parts,
                       double runtime_bytes = kRuntimeBytes, double* host_bytes = nullptr);
// The same on `cluster`: its runtime bytes, and on a machine whose host is
// its device (Cluster::host_is_device) the host tier counted in.
double memory_per_rank(const Workload& w, const Candidate& c, const Cluster& cluster,
                       std::vector<MemoryPart>* parts, double* host_bytes = nullptr);
// The same for a query already made with the cluster's runtime bytes
// (memory_query(w, c, cluster.runtime_bytes)).
double memory_per_rank(const MemoryQuery& q, const Cluster& cluster, std::vector<MemoryPart>* parts,
                       double* host_bytes = nullptr);

// The whole prediction. Not thread-safe: the pipeline plans it simulates
// are cached in a process-wide table. `simulate_pipeline`: run the pipeline plugin's
// schedule (kolos/schedules/plan.h) with per-stage times and transfer
// delays; otherwise the closed-form bubble of plan.h with the slowest
// stage's time (the search's first pass).
Prediction predict(const Workload& w, const Machine& m, const Candidate& c,
                   bool simulate_pipeline = true);

// One transformer block's forward and backward, micro-batch b, one rank
// with no split, by the rates alone (block_factor not applied): what the
// calibration compares a measured block with.
double block_seconds(const ModelShape& m, const MachineRates& rates, double b,
                     double element_bytes);

// Per-stage times for the pipeline simulation.
struct StageTimes {
  double forward = 0, backward = 0;  // B = BI + W
  double backward_input = 0, backward_weight = 0;
};
// Simulates `kind` over P stages, M micro-batches and V chunks with
// per-virtual-stage times `stage` (P·V entries) and `transfer` seconds per
// activation or gradient message between ranks; returns the makespan and,
// in `busiest`, the largest busy time of a rank.
double simulate_schedule(Schedule kind, int64_t P, int64_t M, int64_t V,
                         const std::vector<StageTimes>& stage, double transfer, double* busiest);
// As simulate_schedule, when the P ranks share `slots` cores (fewer cores
// than ranks): `stage` holds full-core times, and the ranks computing at
// any moment split the cores evenly, none faster than one core. Returns the
// makespan.
double simulate_schedule_shared(Schedule kind, int64_t P, int64_t M, int64_t V,
                                const std::vector<StageTimes>& stage, double transfer,
                                double slots);
// The closed form of plan.h (Plan::theoretical_bubble) for uniform stages.
double bubble_fraction(Schedule kind, int64_t P, int64_t M, int64_t V, double f, double bi,
                       double w);

}  // namespace kolos::planner
