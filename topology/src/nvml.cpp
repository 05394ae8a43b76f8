// NVLink peers from NVML, loaded with dlopen only when present: kolos
// neither links libnvidia-ml nor needs nvml.h. The few declarations below
// are NVML's stable C ABI (nvml.h of every driver since R450).
#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "kolos/topology/sources.h"

namespace kolos::topology {
namespace {

using nvmlReturn_t = int;  // NVML_SUCCESS = 0
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr unsigned kMaxLinks = 18;      // NVML_NVLINK_MAX_LINKS (H100: 18)
constexpr int kEnableStateEnabled = 1;  // NVML_FEATURE_ENABLED

// nvmlPciInfo_t (nvml.h): the layout used by the _v2/_v3 PCI queries.
struct NvmlPciInfo {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];  // "00000000:18:00.0"
};

using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using ErrorStringFn = const char* (*)(nvmlReturn_t);
using GetHandleByPciBusIdFn = nvmlReturn_t (*)(const char*, nvmlDevice_t*);
using GetNvLinkStateFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int, int*);
using GetNvLinkRemotePciInfoFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int, NvmlPciInfo*);

// Owns the dlopen handle and, once initialised, NVML's session.
class NvmlLibrary {
 public:
  explicit NvmlLibrary(const std::string& name)
      : handle_(dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    if (!handle_) {
      const char* why = dlerror();
      error_ = name + " not found (" + (why ? why : "dlopen failed") + ")";
    }
  }
  ~NvmlLibrary() {
    if (initialised_ && shutdown_) shutdown_();
    if (handle_) dlclose(handle_);
  }
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  bool loaded() const { return handle_ != nullptr; }
  const std::string& error() const { return error_; }

  template <typename Fn>
  Fn symbol(const char* name) {
    if (!handle_ || !error_.empty()) return nullptr;
    void* p = dlsym(handle_, name);
    if (!p) error_ = std::string("NVML has no ") + name;
    return reinterpret_cast<Fn>(p);
  }

  bool init() {
    auto init = symbol<InitFn>("nvmlInit_v2");
    shutdown_ = symbol<ShutdownFn>("nvmlShutdown");
    error_string_ =
        reinterpret_cast<ErrorStringFn>(handle_ ? dlsym(handle_, "nvmlErrorString") : nullptr);
    if (!init || !shutdown_) return false;
    nvmlReturn_t rc = init();
    if (rc != kNvmlSuccess) {
      error_ = "nvmlInit_v2 failed: " + describe(rc);
      return false;
    }
    initialised_ = true;
    return true;
  }

  std::string describe(nvmlReturn_t rc) const {
    const char* text = error_string_ ? error_string_(rc) : nullptr;
    return text ? text : "NVML error " + std::to_string(rc);
  }

 private:
  void* handle_;
  std::string error_;
  bool initialised_ = false;
  ShutdownFn shutdown_ = nullptr;
  ErrorStringFn error_string_ = nullptr;
};

}  // namespace

NvmlProbe probe_nvml(const std::string& library, const std::vector<std::string>& gpu_bus_ids) {
  NvmlProbe probe;
  NvmlLibrary nvml(library);
  if (!nvml.loaded()) {
    probe.status = nvml.error();
    return probe;
  }
  auto by_bus = nvml.symbol<GetHandleByPciBusIdFn>("nvmlDeviceGetHandleByPciBusId_v2");
  auto link_state = nvml.symbol<GetNvLinkStateFn>("nvmlDeviceGetNvLinkState");
  auto remote_pci = nvml.symbol<GetNvLinkRemotePciInfoFn>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
  if (!by_bus || !link_state || !remote_pci || !nvml.init()) {
    probe.status = nvml.error();
    return probe;
  }
  // Items: the GPUs, then every other NVLink endpoint (an NVSwitch) by bus
  // id. GPUs joined through a common endpoint share a domain.
  const int gpus = static_cast<int>(gpu_bus_ids.size());
  std::map<std::string, int> item;
  for (int g = 0; g < gpus; ++g) item[normalize_bus_id(gpu_bus_ids[g])] = g;
  std::vector<std::pair<int, int>> edges;
  for (int g = 0; g < gpus; ++g) {
    nvmlDevice_t device = nullptr;
    nvmlReturn_t rc = by_bus(gpu_bus_ids[g].c_str(), &device);
    if (rc != kNvmlSuccess) {
      probe.status = "NVML does not know GPU " + gpu_bus_ids[g] + ": " + nvml.describe(rc);
      return probe;
    }
    for (unsigned link = 0; link < kMaxLinks; ++link) {
      int state = 0;
      if (link_state(device, link, &state) != kNvmlSuccess || state != kEnableStateEnabled)
        continue;
      NvmlPciInfo remote{};
      if (remote_pci(device, link, &remote) != kNvmlSuccess) continue;
      const std::string id = normalize_bus_id(remote.busId);
      if (id.empty()) continue;
      auto it = item.emplace(id, static_cast<int>(item.size())).first;
      edges.emplace_back(g, it->second);
    }
  }
  std::vector<int> parent(item.size());
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (auto [a, b] : edges) {
    int ra = find(a), rb = find(b);
    if (ra != rb) parent[std::max(ra, rb)] = std::min(ra, rb);
  }
  std::map<int, int> renumber;
  for (int g = 0; g < gpus; ++g) {
    probe.domain_of_gpu.push_back(
        renumber.emplace(find(g), static_cast<int>(renumber.size())).first->second);
  }
  probe.domains = static_cast<int>(renumber.size());
  probe.used = true;
  probe.status = "used";
  return probe;
}

}  // namespace kolos::topology
