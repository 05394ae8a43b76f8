// Where each node-local rank runs: its cores and NUMA node, and its GPU.
//
// Policy (docs/topology.md, "Binding"):
//   - without GPUs, ranks are spread over the NUMA nodes in proportion to
//     their cores, in contiguous blocks (ranks 0..k-1 on the first node, ...),
//     so that consecutive ranks, which the mesh makes tensor-parallel peers,
//     share a NUMA node;
//   - with GPUs, local rank i uses GPU i and runs on that GPU's NUMA node;
//   - the ranks of one NUMA node share its cores out in disjoint,
//     contiguous blocks (the first ones get one more when they do not
//     divide).
// Torch-free; the same plan is what `kolos run --bind cores` asks OpenMPI
// for on one machine.
#pragma once

#include <string>
#include <vector>

#include "kolos/topology/topology.h"

namespace kolos::topology {

struct RankBinding {
  int local_rank = 0;
  int numa = -1;           // index into Topology::numa_nodes; -1: the node has no NUMA information
  std::vector<int> cores;  // indices into Topology::cores, contiguous
  std::vector<int> pus;    // OS indices of those cores' hardware threads (a cpuset)
  int gpu = -1;            // index into Topology::gpus; -1: none
};

struct BindingPolicy {
  bool use_gpus = false;  // local rank i uses GPU i (and its NUMA node)
};

// The bindings of all LOCAL_SIZE ranks of this node. Throws kolos::Error
// when there are more ranks than cores (naming both), more ranks than GPUs
// under use_gpus, or more ranks on one GPU's NUMA node than it has cores.
std::vector<RankBinding> bindings_for(int local_size, const Topology& topology,
                                      BindingPolicy policy = {});

// One rank's binding: bindings_for(local_size, ...)[local_rank].
RankBinding binding_for(int local_rank, int local_size, const Topology& topology,
                        BindingPolicy policy = {});

// "rank 0: NUMA node 0, cores 0-13 (CPUs 0-13,112-125), GPU 0"
std::string describe(const RankBinding& binding, const Topology& topology);

}  // namespace kolos::topology
