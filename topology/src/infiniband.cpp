// InfiniBand devices from sysfs: class/infiniband/<dev>/ports/<n>/{rate,
// state,link_layer} and class/infiniband/<dev>/device/numa_node.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kolos/core/error.h"
#include "kolos/topology/sources.h"

namespace kolos::topology {
namespace fs = std::filesystem;
namespace {

std::string read_line(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw Error("topology: cannot read " + file.string());
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) {
    line.pop_back();
  }
  return line;
}

}  // namespace

double parse_rate_gbps(const std::string& rate) {
  char* end = nullptr;
  const double value = std::strtod(rate.c_str(), &end);
  return end == rate.c_str() ? 0 : value;
}

std::vector<IbDevice> read_infiniband(const std::string& sysfs_root) {
  const fs::path root = fs::path(sysfs_root) / "class" / "infiniband";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};  // no InfiniBand driver loaded: no devices
  std::vector<IbDevice> devices;
  for (const auto& entry : fs::directory_iterator(root)) {
    IbDevice dev;
    dev.name = entry.path().filename().string();
    const fs::path numa = entry.path() / "device" / "numa_node";
    if (fs::exists(numa, ec)) {
      const std::string text = read_line(numa);
      char* end = nullptr;
      const long value = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0') {
        throw Error("topology: " + numa.string() + ": expected a NUMA node number, found `" + text +
                    "`");
      }
      dev.numa_os = value < 0 ? -1 : static_cast<int>(value);
    }
    const fs::path ports = entry.path() / "ports";
    if (fs::is_directory(ports, ec)) {
      for (const auto& p : fs::directory_iterator(ports)) {
        const std::string name = p.path().filename().string();
        if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
        IbPort port;
        port.port = std::atoi(name.c_str());
        port.rate = read_line(p.path() / "rate");
        port.rate_gbps = parse_rate_gbps(port.rate);
        // "4: ACTIVE" -> "ACTIVE"
        const std::string state = read_line(p.path() / "state");
        const size_t colon = state.find(':');
        port.state = colon == std::string::npos
                         ? state
                         : state.substr(state.find_first_not_of(' ', colon + 1));
        port.link_layer =
            fs::exists(p.path() / "link_layer", ec) ? read_line(p.path() / "link_layer") : "";
        dev.ports.push_back(port);
      }
      std::sort(dev.ports.begin(), dev.ports.end(),
                [](const IbPort& a, const IbPort& b) { return a.port < b.port; });
    }
    devices.push_back(std::move(dev));
  }
  std::sort(devices.begin(), devices.end(), [](const IbDevice& a, const IbDevice& b) {
    return a.name.size() != b.name.size() ? a.name.size() < b.name.size() : a.name < b.name;
  });
  return devices;
}

std::string normalize_bus_id(const std::string& text) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  int used = 0;
  if (text.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos) return "";
  if (std::sscanf(text.c_str(), "%x:%x:%x.%1x%n", &domain, &bus, &dev, &fn, &used) != 4 ||
      used != static_cast<int>(text.size())) {
    return "";
  }
  if (domain > 0xffff || bus > 0xff || dev > 0x1f || fn > 7) return "";
  char out[16];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%01x", domain, bus, dev, fn);
  return out;
}

}  // namespace kolos::topology
