// Shapes the planner's unit tests share: a made-up cluster of 8-GPU nodes
// with round rates, and a small GPT workload.
#pragma once

#include "kolos/planner/cost_model.h"

namespace kolos::planner::fixtures {

// `nodes` nodes of 8 devices of 80 GiB, 100 TFLOP/s and 1 TB/s, joined at
// 100 GB/s inside a node and 10 GB/s between nodes; the rates assumed from
// the cluster (MachineRates::assumed).
inline Machine test_machine(int nodes) {
  Cluster c;
  c.name = "test";
  c.nodes = nodes, c.devices_per_node = 8, c.nvlink_domain = 8;
  c.device_memory = 80.0 * (1 << 30);
  c.peak_flops = 100e12, c.memory_bandwidth = 1e12;
  c.intra_bandwidth = 100e9, c.intra_latency = 1e-6;
  c.inter_bandwidth = 10e9, c.inter_latency = 1e-5;
  c.host_bandwidth = 10e9, c.host_memory = 1e12;
  return Machine{c, MachineRates::assumed(c)};
}

// 8 layers of hidden 1024 with 8 heads, sequence 1024, vocabulary 32000,
// batch 64.
inline Workload small_workload() {
  Workload w;
  w.model.layers = 8, w.model.hidden = 1024, w.model.heads = 8;
  w.model.seq_len = 1024, w.model.vocab = 32000;
  w.global_batch = 64;
  return w;
}

}  // namespace kolos::planner::fixtures
