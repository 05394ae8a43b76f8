// The sources of a Topology besides hwloc, each usable (and tested) on its
// own: InfiniBand from sysfs, NVLink from NVML or from a side file.
#pragma once

#include <string>
#include <vector>

#include "kolos/topology/topology.h"

namespace kolos::topology {

struct IbDevice {
  std::string name;  // "mlx5_0"
  int numa_os = -1;  // device/numa_node; -1: unknown
  std::vector<IbPort> ports;
};

// Every device under SYSFS_ROOT/class/infiniband, with its ports
// (ports/<n>/{rate,state,link_layer}) and device/numa_node, sorted by name.
// A missing class/infiniband means no devices, not an error; an unreadable
// or malformed file of a listed device throws naming the file.
std::vector<IbDevice> read_infiniband(const std::string& sysfs_root);

// "400 Gb/sec (4X NDR)" -> 400; 0 when the text has no leading number.
double parse_rate_gbps(const std::string& rate);

// "00000000:18:00.0" or "0000:18:00.0" -> "0000:18:00.0"; empty when the
// text is not a PCI address.
std::string normalize_bus_id(const std::string& text);

// What NVML said about NVLink.
struct NvmlProbe {
  bool used = false;   // NVML loaded, initialised and answered for every GPU
  std::string status;  // "used", or why not ("libnvidia-ml.so.1 not found: ...")
  // Per GPU of the input (same order): the NVLink domain index; GPUs
  // connected directly or through a common NVSwitch share one.
  std::vector<int> domain_of_gpu;
  int domains = 0;
};

// Loads LIBRARY with dlopen (RTLD_NOW | RTLD_LOCAL) and asks NVML for the
// NVLink links of the GPUs with these PCI bus ids. Never throws: an absent
// library, a missing symbol, a failed nvmlInit or a GPU NVML does not know
// gives used = false and the reason in status. The library is unloaded
// (after nvmlShutdown) before returning.
NvmlProbe probe_nvml(const std::string& library, const std::vector<std::string>& gpu_bus_ids);

// The NVLink side file (JSON):
//   {"nvlink_domains": [["0000:18:00.0", "0000:2a:00.0", ...], ...]}
// each inner list one domain, naming GPUs by PCI bus id or by GPU index.
// Returns per GPU (order of GPUS) its domain index; GPUs the file does not
// name get a domain of their own after the file's. Throws naming the file
// when it is missing, not JSON, names an unknown GPU, or names a GPU twice.
std::vector<int> read_nvlink_file(const std::string& path, const std::vector<Gpu>& gpus);

}  // namespace kolos::topology
