// Topology from hwloc: this machine (discover) or an XML export
// (from_hwloc_xml), then NVLink (NVML, hwloc's NVLinkBandwidth matrix or the
// side file) and InfiniBand (sysfs) on top.
#include "kolos/topology/topology.h"

#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "kolos/core/error.h"
#include "kolos/topology/sources.h"

namespace kolos::topology {
namespace {

// Owns an hwloc topology; destroyed on every path out.
class HwlocTopology {
 public:
  HwlocTopology() {
    if (hwloc_topology_init(&topo_) != 0) {
      throw Error(std::string("topology: hwloc_topology_init failed: ") + std::strerror(errno));
    }
  }
  ~HwlocTopology() { hwloc_topology_destroy(topo_); }
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
  hwloc_topology_t get() const { return topo_; }

 private:
  hwloc_topology_t topo_ = nullptr;
};

// Frees an hwloc bitmap.
struct Bitmap {
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  ~Bitmap() { hwloc_bitmap_free(set); }
  Bitmap() = default;
  Bitmap(const Bitmap&) = delete;
  Bitmap& operator=(const Bitmap&) = delete;
};

std::string info(hwloc_obj_t obj, const char* name) {
  const char* value = hwloc_obj_get_info_by_name(obj, name);
  return value ? value : "";
}

std::string bus_id(hwloc_obj_t pci) {
  char text[32];
  std::snprintf(text, sizeof text, "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain,
                pci->attr->pcidev.bus, pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return text;
}

// The NUMA node (index into numa_nodes) an I/O object is local to: the one
// NUMA node of its first non-I/O ancestor, or -1 when that has none or
// several (a device attached to the whole machine).
int numa_of_io(hwloc_topology_t topo, hwloc_obj_t obj, const std::map<unsigned, int>& numa_index) {
  hwloc_obj_t parent = hwloc_get_non_io_ancestor_obj(topo, obj);
  if (parent == nullptr || parent->nodeset == nullptr) return -1;
  if (hwloc_bitmap_weight(parent->nodeset) != 1) return -1;
  auto it = numa_index.find(static_cast<unsigned>(hwloc_bitmap_first(parent->nodeset)));
  return it == numa_index.end() ? -1 : it->second;
}

// The number after PREFIX in NAME ("cuda3" -> 3), or -1.
int index_after(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  const std::string rest = name.substr(prefix.size());
  if (rest.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::atoi(rest.c_str());
}

bool is_compute_gpu(hwloc_obj_t pci) {
  // An NVIDIA or AMD display/3D controller, or anything a compute runtime
  // (CUDA, OpenCL, ROCm) lists. A BMC's VGA device has a DRM "GPU" OS
  // device too, which is why the OS device type alone does not decide.
  const unsigned base_class = pci->attr->pcidev.class_id >> 8;
  const unsigned vendor = pci->attr->pcidev.vendor_id;
  if (base_class == 0x03 && (vendor == 0x10de || vendor == 0x1002)) return true;
  for (hwloc_obj_t child = pci->io_first_child; child; child = child->next_sibling) {
    if (child->type == HWLOC_OBJ_OS_DEVICE && child->attr->osdev.type == HWLOC_OBJ_OSDEV_COPROC) {
      return true;
    }
  }
  return false;
}

// "mlx5_2" < "mlx5_10": names compared with their trailing numbers as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    size_t i = s.find_last_not_of("0123456789") + 1;
    long n = i < s.size() ? std::atol(s.c_str() + i) : -1;
    return std::make_pair(s.substr(0, i), n);
  };
  return split(a) < split(b);
}

// Connected components of N items under EDGES; component ids in order of
// each component's smallest item.
std::vector<int> components(int n, const std::vector<std::pair<int, int>>& edges) {
  std::vector<int> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  std::function<int(int)> find = [&](int x) {
    return parent[x] == x ? x : parent[x] = find(parent[x]);
  };
  for (auto [a, b] : edges) {
    int ra = find(a), rb = find(b);
    if (ra != rb) parent[std::max(ra, rb)] = std::min(ra, rb);
  }
  std::map<int, int> id;
  std::vector<int> out(n);
  for (int i = 0; i < n; ++i) {
    int root = find(i);
    auto it = id.emplace(root, static_cast<int>(id.size())).first;
    out[i] = it->second;
  }
  return out;
}

// NVLink domains from hwloc's "NVLinkBandwidth" distances matrix (its NVML
// backend exports it; an XML carries it): GPUs with non-zero bandwidth
// between them, directly or through an NVSwitch object of the matrix, share
// a domain. Empty when the topology has no such matrix.
std::vector<int> domains_from_hwloc(hwloc_topology_t topo,
                                    const std::vector<hwloc_obj_t>& gpu_pcis) {
  unsigned nr = 1;
  hwloc_distances_s* dist = nullptr;
  if (hwloc_distances_get_by_name(topo, "NVLinkBandwidth", &nr, &dist, 0) != 0 || nr == 0)
    return {};
  const unsigned n = dist->nbobjs;
  // Matrix objects are OS devices (nvmlN) or PCI devices; map each to a GPU.
  std::vector<int> gpu_of(n, -1);
  for (unsigned i = 0; i < n; ++i) {
    hwloc_obj_t obj = dist->objs[i];
    hwloc_obj_t pci = obj && obj->type == HWLOC_OBJ_OS_DEVICE ? obj->parent : obj;
    for (size_t g = 0; g < gpu_pcis.size(); ++g) {
      if (pci == gpu_pcis[g]) gpu_of[i] = static_cast<int>(g);
    }
  }
  // Items: the GPUs first, then the matrix's other objects (switches).
  const int gpus = static_cast<int>(gpu_pcis.size());
  auto item = [&](unsigned i) { return gpu_of[i] >= 0 ? gpu_of[i] : gpus + static_cast<int>(i); };
  std::vector<std::pair<int, int>> edges;
  bool any_gpu = false;
  for (unsigned i = 0; i < n; ++i) {
    any_gpu |= gpu_of[i] >= 0;
    for (unsigned j = 0; j < n; ++j) {
      if (i != j && dist->values[i * n + j] > 0) edges.emplace_back(item(i), item(j));
    }
  }
  hwloc_distances_release(topo, dist);
  if (!any_gpu) return {};
  std::vector<int> all = components(gpus + static_cast<int>(n), edges);
  // Renumber the GPUs' components 0..k-1 in GPU order.
  std::map<int, int> renumber;
  std::vector<int> out(gpus);
  for (int g = 0; g < gpus; ++g) {
    out[g] = renumber.emplace(all[g], static_cast<int>(renumber.size())).first->second;
  }
  return out;
}

void set_domains(Topology& t, const std::vector<int>& domain_of_gpu, const std::string& source) {
  int count = 0;
  for (int d : domain_of_gpu) count = std::max(count, d + 1);
  t.nvlink_domains.assign(count, {});
  for (size_t g = 0; g < t.gpus.size(); ++g) {
    t.gpus[g].nvlink_domain = domain_of_gpu[g];
    t.nvlink_domains[domain_of_gpu[g]].push_back(static_cast<int>(g));
  }
  t.nvlink_source = source;
}

Topology read(hwloc_topology_t topo, const std::string& source, const Options& options) {
  Topology t;
  t.source = source;
  hwloc_obj_t root = hwloc_get_root_obj(topo);
  t.hostname = info(root, "HostName");
  t.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);

  // NUMA nodes, by OS index.
  std::vector<hwloc_obj_t> numa_objs;
  for (hwloc_obj_t n = nullptr; (n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n));) {
    numa_objs.push_back(n);
  }
  std::sort(numa_objs.begin(), numa_objs.end(),
            [](hwloc_obj_t a, hwloc_obj_t b) { return a->os_index < b->os_index; });
  std::map<unsigned, int> numa_index;  // OS index -> index into numa_nodes
  for (hwloc_obj_t n : numa_objs) {
    NumaNode node;
    node.os_index = static_cast<int>(n->os_index);
    node.memory_bytes = n->attr ? n->attr->numanode.local_memory : 0;
    hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, n);
    node.package = package ? static_cast<int>(package->os_index) : -1;
    numa_index[n->os_index] = static_cast<int>(t.numa_nodes.size());
    t.numa_nodes.push_back(node);
  }

  // Cores (or PUs, on a machine whose hwloc reports no cores), grouped by
  // NUMA node in hwloc's logical order.
  const hwloc_obj_type_t core_type =
      hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  std::vector<Core> cores;
  for (hwloc_obj_t c = nullptr; (c = hwloc_get_next_obj_by_type(topo, core_type, c));) {
    Core core;
    core.os_index = static_cast<int>(c->os_index);
    for (hwloc_obj_t pu = nullptr;
         (pu = hwloc_get_next_obj_inside_cpuset_by_type(topo, c->cpuset, HWLOC_OBJ_PU, pu));) {
      core.pus.push_back(static_cast<int>(pu->os_index));
    }
    std::sort(core.pus.begin(), core.pus.end());
    if (core.pus.empty()) continue;  // a core none of whose threads this process may use
    for (hwloc_obj_t n : numa_objs) {
      if (hwloc_bitmap_isincluded(c->cpuset, n->cpuset)) {
        core.numa = numa_index[n->os_index];
        break;
      }
    }
    hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, c);
    core.package = package ? static_cast<int>(package->os_index) : -1;
    cores.push_back(core);
  }
  std::stable_sort(cores.begin(), cores.end(), [](const Core& a, const Core& b) {
    return (a.numa < 0 ? INT32_MAX : a.numa) < (b.numa < 0 ? INT32_MAX : b.numa);
  });
  for (size_t i = 0; i < cores.size(); ++i) {
    cores[i].index = static_cast<int>(i);
    t.pus += static_cast<int>(cores[i].pus.size());
    if (cores[i].numa >= 0) t.numa_nodes[cores[i].numa].cores.push_back(static_cast<int>(i));
  }
  t.cores = std::move(cores);
  if (t.cores.empty()) {
    throw Error("topology: " + source + " lists no cores or PUs this process may use");
  }

  // GPUs: PCI devices; ordered by CUDA index, then NVML index, then PCI order.
  struct Found {
    Gpu gpu;
    hwloc_obj_t pci;
    long order;
  };
  std::vector<Found> found;
  long pci_order = 0;
  for (hwloc_obj_t p = nullptr; (p = hwloc_get_next_pcidev(topo, p)); ++pci_order) {
    if (!is_compute_gpu(p)) continue;
    Found f{{}, p, 2000000 + pci_order};
    f.gpu.pci_bus_id = bus_id(p);
    f.gpu.numa = numa_of_io(topo, p, numa_index);
    for (hwloc_obj_t child = p->io_first_child; child; child = child->next_sibling) {
      if (child->type != HWLOC_OBJ_OS_DEVICE) continue;
      const std::string name = child->name ? child->name : "";
      f.gpu.os_devices.push_back(name);
      if (int i = index_after(name, "cuda"); i >= 0) f.order = std::min<long>(f.order, i);
      if (int i = index_after(name, "nvml"); i >= 0) f.order = std::min<long>(f.order, 1000000 + i);
      if (f.gpu.model.empty()) f.gpu.model = info(child, "GPUModel");
    }
    if (f.gpu.model.empty()) f.gpu.model = info(p, "PCIDevice");
    if (f.gpu.model.empty()) {
      char id[16];
      std::snprintf(id, sizeof id, "%04x:%04x", p->attr->pcidev.vendor_id,
                    p->attr->pcidev.device_id);
      f.gpu.model = id;
    }
    found.push_back(std::move(f));
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const Found& a, const Found& b) { return a.order < b.order; });
  std::vector<hwloc_obj_t> gpu_pcis;
  for (auto& f : found) {
    f.gpu.index = static_cast<int>(t.gpus.size());
    t.gpus.push_back(f.gpu);
    gpu_pcis.push_back(f.pci);
  }

  // NICs: network and OpenFabrics OS devices, one NIC per PCI device.
  std::map<hwloc_obj_t, size_t> nic_of_parent;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(topo, o));) {
    const auto type = o->attr->osdev.type;
    if (type != HWLOC_OBJ_OSDEV_NETWORK && type != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    const std::string name = o->name ? o->name : "";
    hwloc_obj_t pci = o->parent && o->parent->type == HWLOC_OBJ_PCI_DEVICE ? o->parent : nullptr;
    size_t at;
    auto it = pci ? nic_of_parent.find(pci) : nic_of_parent.end();
    if (it != nic_of_parent.end()) {
      at = it->second;
    } else {
      Nic nic;
      nic.pci_bus_id = pci ? bus_id(pci) : "";
      nic.numa = numa_of_io(topo, o, numa_index);
      nic.kind = "ethernet";
      at = t.nics.size();
      t.nics.push_back(nic);
      if (pci) nic_of_parent[pci] = at;
    }
    Nic& nic = t.nics[at];
    nic.os_devices.push_back(name);
    if (type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
      nic.name = name;
      nic.kind = "infiniband";
    } else if (nic.name.empty()) {
      nic.name = name;
    }
  }

  // InfiniBand ports from sysfs; devices hwloc did not list are added.
  if (!options.sysfs_root.empty()) {
    for (const IbDevice& dev : read_infiniband(options.sysfs_root)) {
      auto it = std::find_if(t.nics.begin(), t.nics.end(),
                             [&](const Nic& n) { return n.name == dev.name; });
      if (it == t.nics.end()) {
        Nic nic;
        nic.name = dev.name;
        nic.os_devices = {dev.name};
        nic.kind = "infiniband";
        t.nics.push_back(nic);
        it = t.nics.end() - 1;
      }
      it->ports = dev.ports;
      if (it->numa < 0 && dev.numa_os >= 0) {
        auto n = numa_index.find(static_cast<unsigned>(dev.numa_os));
        if (n != numa_index.end()) it->numa = n->second;
      }
      const bool ethernet = !dev.ports.empty() &&
                            std::all_of(dev.ports.begin(), dev.ports.end(),
                                        [](const IbPort& p) { return p.link_layer == "Ethernet"; });
      it->kind = ethernet ? "roce" : "infiniband";
    }
  }
  // Verbs devices first (mlx5_0, mlx5_1, ..., mlx5_10 in numeric order), then Ethernet.
  std::stable_sort(t.nics.begin(), t.nics.end(), [](const Nic& a, const Nic& b) {
    const bool ea = a.kind == "ethernet", eb = b.kind == "ethernet";
    if (ea != eb) return eb;
    return natural_less(a.name, b.name);
  });

  // NVLink domains: NVML (live), then the side file, then hwloc's matrix.
  std::string nvlink_file = options.nvlink_file;
  t.nvml_status = options.use_nvml ? "" : "not asked (" + source + ")";
  std::vector<int> domains;
  if (options.use_nvml && !t.gpus.empty()) {
    std::vector<std::string> ids;
    for (const Gpu& g : t.gpus) ids.push_back(g.pci_bus_id);
    NvmlProbe probe = probe_nvml(options.nvml_library, ids);
    t.nvml_status = probe.status;
    if (probe.used) set_domains(t, probe.domain_of_gpu, "nvml");
  } else if (options.use_nvml) {
    t.nvml_status = "not asked (no GPU)";
  }
  if (t.nvlink_source.empty() && !nvlink_file.empty()) {
    set_domains(t, read_nvlink_file(nvlink_file, t.gpus), "file " + nvlink_file);
  }
  if (t.nvlink_source.empty()) {
    std::vector<int> from_hwloc = domains_from_hwloc(topo, gpu_pcis);
    if (!from_hwloc.empty()) set_domains(t, from_hwloc, "hwloc NVLinkBandwidth");
  }
  if (t.nvlink_source.empty()) {
    std::vector<int> own(t.gpus.size());
    std::iota(own.begin(), own.end(), 0);
    set_domains(t, own, t.gpus.empty() ? "none (no GPU)" : "none (each GPU its own domain)");
  }
  return t;
}

void keep_io(hwloc_topology_t topo) {
  // PCI devices, bridges and OS devices are filtered out by default.
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
}

}  // namespace

Topology discover() { return discover(Options{"/sys", "", true, "libnvidia-ml.so.1"}); }

Topology discover(Options options) {
  if (options.nvlink_file.empty()) {
    if (const char* file = std::getenv("KOLOS_NVLINK_FILE"); file && *file)
      options.nvlink_file = file;
  }
  HwlocTopology topo;
  keep_io(topo.get());
  if (hwloc_topology_load(topo.get()) != 0) {
    throw Error(std::string("topology: hwloc cannot read this machine's topology: ") +
                std::strerror(errno));
  }
  Topology t = read(topo.get(), "hwloc discovery of this machine", options);
  if (t.hostname.empty()) {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) == 0) t.hostname = name;
  }
  return t;
}

Topology from_hwloc_xml(const std::string& path_or_text, const Options& options) {
  const size_t first = path_or_text.find_first_not_of(" \t\r\n");
  const bool is_text = first != std::string::npos && path_or_text[first] == '<';
  const std::string what = is_text ? "hwloc XML text" : "hwloc XML file " + path_or_text;
  if (!is_text) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path_or_text, ec)) {
      throw Error(
          "topology: " + what + ": " +
          (std::filesystem::exists(path_or_text, ec) ? "not a regular file" : "no such file"));
    }
  }
  HwlocTopology topo;
  keep_io(topo.get());
  const int set = is_text ? hwloc_topology_set_xmlbuffer(topo.get(), path_or_text.c_str(),
                                                         static_cast<int>(path_or_text.size()) + 1)
                          : hwloc_topology_set_xml(topo.get(), path_or_text.c_str());
  if (set != 0) {
    throw Error("topology: " + what +
                ": hwloc cannot parse it as a topology (hwloc 2.x XML, `lstopo FILE.xml`; set "
                "HWLOC_XML_VERBOSE=1 for hwloc's reason): " +
                std::strerror(errno));
  }
  if (hwloc_topology_load(topo.get()) != 0) {
    throw Error("topology: " + what + ": hwloc cannot load it: " + std::strerror(errno));
  }
  return read(topo.get(), is_text ? "hwloc XML text" : path_or_text, options);
}

std::string format_ranges(std::vector<int> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  std::string out;
  for (size_t i = 0; i < values.size();) {
    size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(values[i]);
    if (j > i) out += "-" + std::to_string(values[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace kolos::topology
