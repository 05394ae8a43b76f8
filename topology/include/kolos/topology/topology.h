// What a node is made of, as kolos needs it for placing ranks: packages,
// NUMA nodes with their memory, cores (and their hardware threads), GPUs
// with their NUMA node and NVLink domain, NICs with their NUMA node and
// InfiniBand ports.
//
// Sources (docs/topology.md):
//   - hwloc 2.x: the CPU, memory and PCI tree, of this machine (discover())
//     or of an exported XML file (from_hwloc_xml()), so the same code runs
//     on a laptop against a DGX node's description;
//   - NVML (libnvidia-ml.so.1, loaded with dlopen only when present): each
//     GPU's NVLink peers, grouped into NVLink domains;
//   - an optional side file listing the NVLink domains, used when NVML is
//     absent (a test machine, or an XML from another node);
//   - sysfs (/sys/class/infiniband): each InfiniBand device's ports (rate,
//     state, link layer) and NUMA node.
//
// Torch-free and MPI-free: it links kolos_base and hwloc only. Errors are
// kolos::Error naming the file (or "this machine") and what was wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolos::topology {

struct Core {
  int index = 0;         // position in Topology::cores (ordered by NUMA node, then hwloc's order)
  int os_index = 0;      // the core's id within its package, as Linux reports it
  std::vector<int> pus;  // OS indices of its hardware threads (what a cpuset names)
  int numa = -1;         // index into Topology::numa_nodes; -1: none (no NUMA information)
  int package = -1;      // OS index of its package; -1: unknown
};

struct NumaNode {
  int os_index = 0;
  uint64_t memory_bytes = 0;
  int package = -1;        // OS index of the package it belongs to; -1: none or several
  std::vector<int> cores;  // indices into Topology::cores, ascending
};

struct Gpu {
  int index = 0;                        // GPU i is what local rank i uses (CUDA order when known)
  std::string pci_bus_id;               // "0000:18:00.0"
  std::string model;                    // "NVIDIA H100 80GB HBM3", or the PCI device name
  std::vector<std::string> os_devices;  // "cuda0", "nvml0"
  int numa = -1;                        // index into Topology::numa_nodes; -1: unknown or several
  int nvlink_domain = -1;               // index into Topology::nvlink_domains
};

struct IbPort {
  int port = 0;
  std::string rate;        // "400 Gb/sec (4X NDR)", as sysfs has it
  double rate_gbps = 0;    // 400
  std::string state;       // "ACTIVE" (from "4: ACTIVE")
  std::string link_layer;  // "InfiniBand" or "Ethernet" (RoCE)
};

struct Nic {
  std::string name;  // the verbs device ("mlx5_0") when there is one, else the interface ("eth0")
  std::string pci_bus_id;               // empty when not a PCI device
  std::vector<std::string> os_devices;  // "ib0", "mlx5_0"
  std::string kind;                     // "infiniband", "roce" or "ethernet"
  int numa = -1;                        // index into Topology::numa_nodes; -1: unknown or several
  std::vector<IbPort> ports;            // from sysfs; empty for plain Ethernet
};

struct Topology {
  std::string source;  // "hwloc discovery of this machine" or the XML file
  std::string hostname;
  int packages = 0;
  std::vector<NumaNode> numa_nodes;  // ordered by OS index
  std::vector<Core> cores;
  int pus = 0;  // hardware threads in all cores
  std::vector<Gpu> gpus;
  std::vector<Nic> nics;
  // NVLink domains: GPU indices that reach each other over NVLink (directly
  // or through NVSwitches). Without NVLink information each GPU is its own
  // domain.
  std::vector<std::vector<int>> nvlink_domains;
  std::string nvlink_source;  // "nvml", "hwloc NVLinkBandwidth", "file <path>", "none"
  std::string nvml_status;    // "used", or why NVML was not used ("libnvidia-ml.so.1 not found")

  int cores_in_numa(int numa) const { return static_cast<int>(numa_nodes.at(numa).cores.size()); }
};

struct Options {
  // Root under which class/infiniband is read ("/sys"); empty: no sysfs.
  std::string sysfs_root;
  // The NVLink side file (JSON, docs/topology.md); empty: none. Used when
  // NVML gives no answer.
  std::string nvlink_file;
  // Ask NVML (dlopen) for NVLink peers. Only meaningful for discover(): an
  // XML describes another machine than the one whose NVML would answer.
  bool use_nvml = false;
  // The NVML library to load (tests point it elsewhere).
  std::string nvml_library = "libnvidia-ml.so.1";
};

// This machine, through hwloc (PCI and OS devices included), NVML when
// libnvidia-ml.so.1 loads, and /sys/class/infiniband. The cores and NUMA
// nodes are those of this process's cgroup, not of its current binding, so
// a rank that mpirun bound to one core still sees (and plans for) the node.
// KOLOS_NVLINK_FILE names a side file when options.nvlink_file is empty.
Topology discover();
Topology discover(Options options);

// An hwloc XML export (`lstopo node.xml`, hwloc 2.x): a file path, or the
// XML text itself when it starts with '<'. Throws kolos::Error naming the
// file when it is missing or not a topology hwloc can load.
Topology from_hwloc_xml(const std::string& path_or_text, const Options& options = {});

// Human-readable, what `kolos topo` prints.
std::string to_text(const Topology& topology);
// JSON, what `kolos topo --json` prints (schema in docs/topology.md).
std::string to_json(const Topology& topology);

// "0-3,8,10-11": a sorted list of integers as ranges.
std::string format_ranges(std::vector<int> values);

}  // namespace kolos::topology
