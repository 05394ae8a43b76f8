// The NVLink side file: the NVLink domains of a node when NVML cannot be
// asked (docs/topology.md).
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kolos/core/error.h"
#include "kolos/topology/sources.h"

namespace kolos::topology {

std::vector<int> read_nvlink_file(const std::string& path, const std::vector<Gpu>& gpus) {
  std::ifstream in(path);
  if (!in) throw Error("topology: NVLink file " + path + ": cannot open it");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error("topology: NVLink file " + path + ": not JSON: " + e.what());
  }
  const std::string shape =
      " (expected {\"nvlink_domains\": [[\"0000:18:00.0\", ...], ...]}, GPUs by PCI bus id or "
      "index)";
  if (!doc.is_object() || !doc.contains("nvlink_domains") || !doc["nvlink_domains"].is_array()) {
    throw Error("topology: NVLink file " + path + ": no array `nvlink_domains`" + shape);
  }
  std::map<std::string, int> by_bus;
  for (const Gpu& g : gpus) by_bus[g.pci_bus_id] = g.index;
  std::vector<int> domain(gpus.size(), -1);
  int d = 0;
  for (const auto& list : doc["nvlink_domains"]) {
    if (!list.is_array()) {
      throw Error("topology: NVLink file " + path + ": domain " + std::to_string(d) +
                  " is not a list" + shape);
    }
    if (list.empty()) continue;
    for (const auto& item : list) {
      int gpu = -1;
      std::string name;
      if (item.is_number_integer()) {
        gpu = item.get<int>();
        name = "GPU index " + std::to_string(gpu);
        if (gpu < 0 || gpu >= static_cast<int>(gpus.size())) gpu = -1;
      } else if (item.is_string()) {
        name = item.get<std::string>();
        auto it = by_bus.find(normalize_bus_id(name));
        if (it != by_bus.end()) gpu = it->second;
      } else {
        throw Error("topology: NVLink file " + path + ": domain " + std::to_string(d) +
                    " has an entry that is neither a PCI bus id nor an index: " + item.dump() +
                    shape);
      }
      if (gpu < 0) {
        std::string known;
        for (const Gpu& g : gpus) known += (known.empty() ? "" : ", ") + g.pci_bus_id;
        throw Error("topology: NVLink file " + path + ": domain " + std::to_string(d) + " names " +
                    name + ", which is not a GPU of this topology (GPUs: " +
                    (known.empty() ? "none" : known) + ")");
      }
      if (domain[gpu] >= 0) {
        throw Error("topology: NVLink file " + path + ": GPU " + std::to_string(gpu) + " (" +
                    gpus[gpu].pci_bus_id + ") is in domains " + std::to_string(domain[gpu]) +
                    " and " + std::to_string(d));
      }
      domain[gpu] = d;
    }
    ++d;
  }
  for (int& g : domain) {
    if (g < 0) g = d++;
  }
  return domain;
}

}  // namespace kolos::topology
