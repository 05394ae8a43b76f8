// The machine the planner plans for: the cluster file (TOML) and the rates
// the cost model divides by.
//
// A cluster file has a [cluster] table (every key required) and an optional
// [rates] table (every key required when the table is present); without
// [rates] the rates are assumed fractions of the peaks (MachineRates::assumed).
// A calibration cache file ([calibration], written by a future on-machine
// calibration; read here) overrides the rates and adds measured
// collective alpha/beta per group size within a node. docs/planner.md lists
// every field. Errors are ConfigErrors "file:line: table.key: what is wrong";
// a missing key names the line of its table's header.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kolos/core/plugin_terms.h"

namespace kolos::planner {

struct Cluster {
  std::string name;
  std::string source;  // the file it was read from
  int64_t nodes = 0;
  int64_t devices_per_node = 0;
  double device_memory = 0;     // bytes per device
  double peak_flops = 0;        // dense FLOP/s per device in the training precision
  double memory_bandwidth = 0;  // device memory (HBM) bytes/s
  double intra_bandwidth = 0;   // bytes/s per device and direction inside an NVLink domain
  double intra_latency = 0;     // seconds per message step inside an NVLink domain
  double inter_bandwidth = 0;  // bytes/s per device and direction between domains (its NIC's share)
  double inter_latency = 0;    // seconds per message step between domains
  int64_t nvlink_domain = 0;   // consecutive devices that share the fast fabric
  double host_bandwidth = 0;   // bytes/s per device to host memory (PCIe), for offload
  double host_memory = 0;      // bytes of host memory per node
  // A CPU machine (kolos plan on this machine): the memory role's host
  // tier is in the same memory as the "device's", and counts against it.
  bool host_is_device = false;
  // Bytes a rank holds before the model exists (CUDA context, NCCL,
  // LibTorch). Not in the file: assumed 2 GiB for a GPU cluster; planning
  // for this machine measures it (the process's resident set).
  double runtime_bytes = 2.0 * 1024 * 1024 * 1024;

  int64_t devices() const { return nodes * devices_per_node; }
};

// What the plugins issue (kolos/core/plugin_terms.h).
using Collective = ::kolos::Collective;
const char* to_string(Collective op);

// Time of one collective step: alpha + bytes / beta.
struct AlphaBeta {
  double alpha = 0;  // seconds
  double beta = 0;   // bytes/s
};

struct MachineRates {
  double gemm_flops = 0;         // achieved FLOP/s of large matrix products
  double attention_flops = 0;    // achieved FLOP/s of the attention core
  double elementwise_bytes = 0;  // achieved bytes/s of memory-bound kernels
  // Measured (op, group size) -> alpha/beta within one NVLink domain; where a
  // pair is absent the cluster's intra figures are used.
  std::map<std::pair<Collective, int64_t>, AlphaBeta> measured;
  // Measured matrix-product rates by size: (FLOPs of one product, FLOP/s),
  // ascending. Small products run far below the large ones' rate; where the
  // curve exists gemm_rate() interpolates it (log-log), else gemm_flops.
  std::vector<std::pair<double, double>> gemm_curve;
  // Fixed cost of one kernel (launch or CPU dispatch), measured; 0: none.
  double op_seconds = 0;
  // Measured time of a whole transformer block (forward and backward, one
  // rank, no split) over what the rates above predict for it: the kernels
  // the rates leave out (reshapes, masks, autograd's bookkeeping). Applies
  // to every block and the logit layer; 1: none.
  double block_factor = 1;
  // Measured with the block at micro-batches 1, 2, 4, ...: the part of a block's
  // forward and backward that does not grow with the micro-batch (the
  // kernels' and autograd's fixed costs per pass), seconds per block and
  // micro-batch; the block factor is then the slope. 0: none.
  double block_fixed = 0;
  // A whole training step of a reference run (data parallelism over every
  // rank) measured on this machine over what the model predicts for it:
  // what the model leaves out of a step (the optimizer's memory traffic
  // under contention, the communication threads' share of the cores, the
  // engine's own work). Applies to every prediction's step; 1: none.
  double step_factor = 1;
  // Cores the ranks of one node share when there are fewer than ranks (a
  // CPU run with more ranks than cores): the rates above were measured with
  // every rank busy, so a rank that waits lends its share to the others,
  // and nothing hides communication. 0: a core (a device) per rank.
  double cores = 0;
  // With shared cores: what a collective over a group of this size costs
  // beyond its alpha-beta time when its ranks arrive from compute (a peer
  // may be waiting for a core), measured per group size.
  std::map<int64_t, double> sync;
  // The same per collective where a layer's collectives alternate between
  // groups that together span a larger set (its size the key): a tensor
  // grid's rows and columns (grid_sync, by the tensor group's size), a
  // ring's hops (ring_sync, by the ring's size). Each rank then waits on
  // peers outside its own group.
  std::map<int64_t, double> grid_sync, ring_sync;
  // The entry for the largest size <= group (of `sync` by default).
  double sync_seconds(int64_t group) const { return sync_seconds(sync, group); }
  static double sync_seconds(const std::map<int64_t, double>& table, int64_t group);
  // The relative spread (one standard deviation of ln measured/predicted)
  // the calibration measured in its own repeated measurements: the floor of
  // a prediction's uncertainty (tune.h). 0: not measured.
  double spread = 0;
  // Finalists measured on this machine: per plan family (tune.h family_of),
  // the ratios measured / model (the model's prediction without feedback),
  // oldest first. A family's prediction is multiplied by their geometric
  // mean, weighed against the model by their number (tune.h
  // feedback_factor).
  std::map<std::string, std::vector<double>> feedback;
  std::string source;                        // "assumed", the cluster file, or the calibration file

  double gemm_rate(double flops_per_product) const;

  // Fractions of the cluster's peaks, not measured: GEMM 0.80 and attention
  // 0.40 of peak_flops, elementwise 0.80 of memory_bandwidth.
  static MachineRates assumed(const Cluster& cluster);
};

struct ClusterFile {
  Cluster cluster;
  MachineRates rates;
};

// Reads a cluster file. Throws ConfigError (file, line, field) on a missing
// or malformed field, an unknown key, or a value out of range.
ClusterFile load_cluster(const std::string& path);
ClusterFile parse_cluster(const std::string& toml_text, const std::string& name);

// Reads a calibration cache file over `rates` (its fields replace theirs).
MachineRates load_calibration(const std::string& path, MachineRates rates);
MachineRates parse_calibration(const std::string& toml_text, const std::string& name,
                               MachineRates rates);
// A calibration file's text for `rates` (what parse_calibration reads back).
std::string format_calibration(const std::string& host, const MachineRates& rates);

}  // namespace kolos::planner
