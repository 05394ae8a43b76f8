// to_text (what `kolos topo` prints) and to_json (`kolos topo --json`).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kolos/topology/topology.h"

namespace kolos::topology {
namespace {

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

std::string join(const std::vector<std::string>& words, const char* sep = " ") {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : sep) + w;
  return out;
}

std::vector<int> pus_of(const Topology& t, const std::vector<int>& cores) {
  std::vector<int> pus;
  for (int c : cores) pus.insert(pus.end(), t.cores[c].pus.begin(), t.cores[c].pus.end());
  return pus;
}

std::string gpu_line(const Gpu& g) {
  std::ostringstream out;
  out << "GPU " << g.index << "  " << g.pci_bus_id << "  " << g.model;
  if (!g.os_devices.empty()) out << "  (" << join(g.os_devices) << ")";
  out << "  NVLink domain " << g.nvlink_domain;
  return out.str();
}

std::string nic_line(const Nic& n) {
  std::ostringstream out;
  out << "NIC " << n.name << "  " << (n.pci_bus_id.empty() ? "-" : n.pci_bus_id) << "  " << n.kind;
  std::vector<std::string> others;
  for (const auto& d : n.os_devices) {
    if (d != n.name) others.push_back(d);
  }
  if (!others.empty()) out << "  (" << join(others) << ")";
  for (const IbPort& p : n.ports) {
    out << "  port " << p.port << ": " << p.rate << ", " << p.state;
    if (!p.link_layer.empty()) out << ", " << p.link_layer;
  }
  return out.str();
}

}  // namespace

std::string to_text(const Topology& t) {
  std::ostringstream out;
  out << "host " << (t.hostname.empty() ? "?" : t.hostname) << " (" << t.source << ")\n";
  out << t.packages << " package(s), " << t.numa_nodes.size() << " NUMA node(s), " << t.cores.size()
      << " cores, " << t.pus << " hardware threads, " << t.gpus.size() << " GPU(s), "
      << t.nics.size() << " NIC(s)\n";
  for (size_t i = 0; i < t.numa_nodes.size(); ++i) {
    const NumaNode& n = t.numa_nodes[i];
    out << "NUMA node " << n.os_index << ": " << gib(n.memory_bytes) << ", " << n.cores.size()
        << " cores, CPUs " << (n.cores.empty() ? "none" : format_ranges(pus_of(t, n.cores)));
    if (n.package >= 0) out << ", package " << n.package;
    out << "\n";
    for (const Gpu& g : t.gpus) {
      if (g.numa == static_cast<int>(i)) out << "  " << gpu_line(g) << "\n";
    }
    for (const Nic& nic : t.nics) {
      if (nic.numa == static_cast<int>(i)) out << "  " << nic_line(nic) << "\n";
    }
  }
  bool header = false;
  for (const Gpu& g : t.gpus) {
    if (g.numa >= 0) continue;
    if (!header) out << "not local to one NUMA node:\n";
    header = true;
    out << "  " << gpu_line(g) << "\n";
  }
  for (const Nic& nic : t.nics) {
    if (nic.numa >= 0) continue;
    if (!header) out << "not local to one NUMA node:\n";
    header = true;
    out << "  " << nic_line(nic) << "\n";
  }
  if (!t.gpus.empty()) {
    out << "NVLink domains (" << t.nvlink_source << "):";
    for (size_t d = 0; d < t.nvlink_domains.size(); ++d) {
      out << (d ? "," : "") << " " << d << ": GPUs " << format_ranges(t.nvlink_domains[d]);
    }
    out << "\n";
  }
  out << "NVML: " << t.nvml_status << "\n";
  return out.str();
}

std::string to_json(const Topology& t) {
  using nlohmann::json;
  json doc;
  doc["schema"] = "kolos.topology/1";
  doc["source"] = t.source;
  doc["hostname"] = t.hostname;
  doc["packages"] = t.packages;
  doc["pus"] = t.pus;
  json numa = json::array();
  for (const NumaNode& n : t.numa_nodes) {
    numa.push_back({{"os_index", n.os_index},
                    {"memory_bytes", n.memory_bytes},
                    {"package", n.package},
                    {"cores", n.cores},
                    {"cpus", format_ranges(pus_of(t, n.cores))}});
  }
  doc["numa_nodes"] = numa;
  json cores = json::array();
  for (const Core& c : t.cores) {
    cores.push_back({{"index", c.index},
                     {"os_index", c.os_index},
                     {"pus", c.pus},
                     {"numa", c.numa},
                     {"package", c.package}});
  }
  doc["cores"] = cores;
  json gpus = json::array();
  for (const Gpu& g : t.gpus) {
    gpus.push_back({{"index", g.index},
                    {"pci_bus_id", g.pci_bus_id},
                    {"model", g.model},
                    {"os_devices", g.os_devices},
                    {"numa", g.numa},
                    {"nvlink_domain", g.nvlink_domain}});
  }
  doc["gpus"] = gpus;
  json nics = json::array();
  for (const Nic& n : t.nics) {
    json ports = json::array();
    for (const IbPort& p : n.ports) {
      ports.push_back({{"port", p.port},
                       {"rate", p.rate},
                       {"rate_gbps", p.rate_gbps},
                       {"state", p.state},
                       {"link_layer", p.link_layer}});
    }
    nics.push_back({{"name", n.name},
                    {"pci_bus_id", n.pci_bus_id},
                    {"os_devices", n.os_devices},
                    {"kind", n.kind},
                    {"numa", n.numa},
                    {"ports", ports}});
  }
  doc["nics"] = nics;
  doc["nvlink"] = {{"source", t.nvlink_source}, {"domains", t.nvlink_domains}};
  doc["nvml"] = t.nvml_status;
  return doc.dump(2) + "\n";
}

}  // namespace kolos::topology
