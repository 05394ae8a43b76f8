// Topology from real hwloc: the DGX-H100-like and 2-socket CPU fixtures
// (fixtures/make_fixtures.py), this machine, and the sources besides hwloc.
#include "kolos/topology/topology.h"

#include <gtest/gtest.h>
#include <hwloc.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "error_of.h"
#include "kolos/core/error.h"
#include "kolos/topology/sources.h"

namespace kolos::topology {
namespace {

const std::string kFixtures = KOLOS_TOPOLOGY_FIXTURES;
const std::string kDgx = kFixtures + "/dgx-h100.xml";
const std::string kCpu = kFixtures + "/cpu-2s.xml";

Options dgx_options() {
  Options o;
  o.sysfs_root = kFixtures + "/dgx-h100-sys";
  o.nvlink_file = kFixtures + "/dgx-h100.nvlink.json";
  return o;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh directory, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char name[] = "/tmp/kolos-topology-test.XXXXXX";
    path = mkdtemp(name);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

TEST(TopologyDgx, CountsCoresNumaAndMemory) {
  const Topology t = from_hwloc_xml(kDgx, dgx_options());
  EXPECT_EQ(t.hostname, "dgx01");
  EXPECT_EQ(t.source, kDgx);
  EXPECT_EQ(t.packages, 2);
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_EQ(t.cores.size(), 112u);
  EXPECT_EQ(t.pus, 224);
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(t.numa_nodes[n].os_index, n);
    EXPECT_EQ(t.numa_nodes[n].package, n);
    EXPECT_EQ(t.numa_nodes[n].memory_bytes, 1082331758592ull);
    ASSERT_EQ(t.numa_nodes[n].cores.size(), 56u);
    for (int c : t.numa_nodes[n].cores) {
      EXPECT_EQ(t.cores[c].numa, n);
      EXPECT_EQ(t.cores[c].package, n);
    }
  }
  // Core 0 of socket 1 has hardware threads 56 and 168 (Linux numbering:
  // first threads of all cores, then their siblings).
  const Core& c = t.cores[t.numa_nodes[1].cores[0]];
  EXPECT_EQ(c.os_index, 0);
  EXPECT_EQ(c.pus, (std::vector<int>{56, 168}));
}

TEST(TopologyDgx, GpusInCudaOrderWithNumaAffinity) {
  const Topology t = from_hwloc_xml(kDgx, dgx_options());
  // The BMC's VGA device (card0) and the 4 NVSwitches are not GPUs.
  ASSERT_EQ(t.gpus.size(), 8u);
  const std::vector<std::string> bus = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0",
                                        "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0",
                                        "0000:ba:00.0", "0000:db:00.0"};
  for (int i = 0; i < 8; ++i) {
    const Gpu& g = t.gpus[i];
    EXPECT_EQ(g.index, i);
    EXPECT_EQ(g.pci_bus_id, bus[i]);
    EXPECT_EQ(g.model, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(g.numa, i / 4) << "GPU " << i;
    EXPECT_EQ(g.os_devices,
              (std::vector<std::string>{"cuda" + std::to_string(i), "nvml" + std::to_string(i)}));
  }
}

TEST(TopologyDgx, NvlinkDomainOfEightFromTheSideFile) {
  const Topology t = from_hwloc_xml(kDgx, dgx_options());
  ASSERT_EQ(t.nvlink_domains.size(), 1u);
  EXPECT_EQ(t.nvlink_domains[0], (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(t.nvlink_source, "file " + dgx_options().nvlink_file);
  for (const Gpu& g : t.gpus) EXPECT_EQ(g.nvlink_domain, 0);
  EXPECT_NE(t.nvml_status.find("not asked"), std::string::npos) << t.nvml_status;
}

TEST(TopologyDgx, WithoutNvlinkInformationEachGpuIsItsOwnDomain) {
  Options o = dgx_options();
  o.nvlink_file.clear();
  const Topology t = from_hwloc_xml(kDgx, o);
  ASSERT_EQ(t.nvlink_domains.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(t.gpus[i].nvlink_domain, i);
    EXPECT_EQ(t.nvlink_domains[i], std::vector<int>{i});
  }
  EXPECT_EQ(t.nvlink_source, "none (each GPU its own domain)");
}

TEST(TopologyDgx, NicsWithNumaAffinityAndInfinibandPorts) {
  const Topology t = from_hwloc_xml(kDgx, dgx_options());
  ASSERT_EQ(t.nics.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const Nic& n = t.nics[i];
    EXPECT_EQ(n.name, "mlx5_" + std::to_string(i));
    EXPECT_EQ(n.kind, "infiniband");
    EXPECT_EQ(n.numa, i / 4) << n.name;
    EXPECT_EQ(n.os_devices, (std::vector<std::string>{"ib" + std::to_string(i), n.name}));
    ASSERT_EQ(n.ports.size(), 1u) << n.name;
    EXPECT_EQ(n.ports[0].port, 1);
    EXPECT_EQ(n.ports[0].rate, "400 Gb/sec (4X NDR)");
    EXPECT_DOUBLE_EQ(n.ports[0].rate_gbps, 400);
    EXPECT_EQ(n.ports[0].state, "ACTIVE");
    EXPECT_EQ(n.ports[0].link_layer, "InfiniBand");
  }
  // Each NIC shares its PCIe switch with one GPU: NIC i sits one bus below GPU i.
  EXPECT_EQ(t.nics[0].pci_bus_id, "0000:17:00.0");
  EXPECT_EQ(t.nics[7].pci_bus_id, "0000:da:00.0");
}

TEST(TopologyDgx, XmlTextGivesWhatTheFileGives) {
  const Topology from_file = from_hwloc_xml(kDgx, dgx_options());
  const Topology from_text = from_hwloc_xml(read_file(kDgx), dgx_options());
  EXPECT_EQ(from_text.source, "hwloc XML text");
  nlohmann::json a = nlohmann::json::parse(to_json(from_file));
  nlohmann::json b = nlohmann::json::parse(to_json(from_text));
  for (auto* doc : {&a, &b}) {
    doc->erase("source");  // the file's name, or "hwloc XML text"
    doc->erase("nvml");    // "not asked (<source>)"
  }
  EXPECT_EQ(a, b) << nlohmann::json::diff(a, b).dump(1);
}

TEST(TopologyDgx, TextNamesEveryPart) {
  const std::string text = to_text(from_hwloc_xml(kDgx, dgx_options()));
  for (const char* part :
       {"host dgx01",
        "2 package(s), 2 NUMA node(s), 112 cores, 224 hardware threads, 8 GPU(s), 8 NIC(s)",
        "NUMA node 0: 1008.0 GiB, 56 cores, CPUs 0-55,112-167, package 0",
        "NUMA node 1: 1008.0 GiB, 56 cores, CPUs 56-111,168-223, package 1",
        "GPU 5  0000:ab:00.0  NVIDIA H100 80GB HBM3  (cuda5 nvml5)  NVLink domain 0",
        "NIC mlx5_3  0000:5c:00.0  infiniband  (ib3)  port 1: 400 Gb/sec (4X NDR), ACTIVE, "
        "InfiniBand",
        "NVLink domains (file ", "): 0: GPUs 0-7"}) {
    EXPECT_NE(text.find(part), std::string::npos) << "missing `" << part << "` in:\n" << text;
  }
  // GPU 5 is listed under NUMA node 1, after its header.
  EXPECT_GT(text.find("GPU 5 "), text.find("NUMA node 1:"));
  if (std::getenv("KOLOS_PRINT_TOPOLOGY")) std::cout << text;
}

TEST(TopologyDgx, JsonCarriesTheSameFacts) {
  const Topology t = from_hwloc_xml(kDgx, dgx_options());
  const nlohmann::json doc = nlohmann::json::parse(to_json(t));
  EXPECT_EQ(doc["schema"], "kolos.topology/1");
  EXPECT_EQ(doc["hostname"], "dgx01");
  EXPECT_EQ(doc["packages"], 2);
  EXPECT_EQ(doc["pus"], 224);
  ASSERT_EQ(doc["numa_nodes"].size(), 2u);
  EXPECT_EQ(doc["numa_nodes"][1]["cpus"], "56-111,168-223");
  EXPECT_EQ(doc["numa_nodes"][1]["memory_bytes"].get<uint64_t>(), 1082331758592ull);
  ASSERT_EQ(doc["cores"].size(), 112u);
  EXPECT_EQ(doc["cores"][56]["pus"], nlohmann::json::array({56, 168}));
  ASSERT_EQ(doc["gpus"].size(), 8u);
  EXPECT_EQ(doc["gpus"][6]["pci_bus_id"], "0000:ba:00.0");
  EXPECT_EQ(doc["gpus"][6]["numa"], 1);
  ASSERT_EQ(doc["nics"].size(), 8u);
  EXPECT_EQ(doc["nics"][2]["ports"][0]["rate_gbps"], 400.0);
  EXPECT_EQ(doc["nvlink"]["domains"], nlohmann::json::parse("[[0,1,2,3,4,5,6,7]]"));
  // Every core of the JSON appears in exactly one NUMA node's list.
  std::multiset<int> listed;
  for (const auto& n : doc["numa_nodes"]) {
    for (int c : n["cores"]) listed.insert(c);
  }
  EXPECT_EQ(listed.size(), 112u);
  EXPECT_EQ(std::set<int>(listed.begin(), listed.end()).size(), 112u);
}

TEST(TopologyCpu, TwoSocketsNoGpuOneEthernetNic) {
  Options o;
  o.sysfs_root = "/nonexistent-sysfs";  // no class/infiniband there: no IB devices, no error
  const Topology t = from_hwloc_xml(kCpu, o);
  EXPECT_EQ(t.hostname, "cpu01");
  EXPECT_EQ(t.packages, 2);
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_EQ(t.cores.size(), 64u);
  EXPECT_EQ(t.pus, 128);
  EXPECT_EQ(t.numa_nodes[0].cores.size(), 32u);
  EXPECT_EQ(t.numa_nodes[1].cores.size(), 32u);
  EXPECT_EQ(t.numa_nodes[1].memory_bytes, 256ull << 30);
  EXPECT_TRUE(t.gpus.empty());
  EXPECT_TRUE(t.nvlink_domains.empty());
  EXPECT_EQ(t.nvlink_source, "none (no GPU)");
  ASSERT_EQ(t.nics.size(), 1u);
  EXPECT_EQ(t.nics[0].name, "eth0");
  EXPECT_EQ(t.nics[0].kind, "ethernet");
  EXPECT_EQ(t.nics[0].numa, 0);
  EXPECT_EQ(t.nics[0].pci_bus_id, "0000:31:00.0");
  EXPECT_TRUE(t.nics[0].ports.empty());
  const std::string text = to_text(t);
  EXPECT_NE(text.find("NIC eth0  0000:31:00.0  ethernet"), std::string::npos) << text;
  EXPECT_EQ(text.find("NVLink"), std::string::npos) << text;
}

// The CPUs this process may run on, as the kernel says.
std::set<int> affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  std::set<int> cpus;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) cpus.insert(i);
  }
  return cpus;
}

TEST(TopologyThisMachine, AgreesWithTheKernel) {
  const Topology t = discover();
  ASSERT_GE(t.cores.size(), 1u);
  EXPECT_GE(t.numa_nodes.size(), 1u);
  EXPECT_EQ(t.source, "hwloc discovery of this machine");
  EXPECT_FALSE(t.hostname.empty());
  std::set<int> pus;
  for (const Core& c : t.cores) pus.insert(c.pus.begin(), c.pus.end());
  EXPECT_EQ(static_cast<int>(pus.size()), t.pus);
  // hwloc lists the CPUs of this process's cgroup: every CPU the process
  // may run on, and no more than are online.
  const std::set<int> mask = affinity();
  EXPECT_TRUE(std::includes(pus.begin(), pus.end(), mask.begin(), mask.end()));
  EXPECT_LE(t.pus, sysconf(_SC_NPROCESSORS_ONLN));
  if (static_cast<long>(mask.size()) == sysconf(_SC_NPROCESSORS_ONLN)) EXPECT_EQ(pus, mask);
  // Without libnvidia-ml.so.1 there is no NVML and no error.
  if (t.gpus.empty()) EXPECT_EQ(t.nvml_status, "not asked (no GPU)");
  EXPECT_NO_THROW(nlohmann::json::parse(to_json(t)));
}

TEST(TopologyThisMachine, ABoundProcessStillSeesTheWholeNode) {
  // A rank bound to one CPU (mpirun --bind-to core) plans for the whole
  // node: discover() is not narrowed to the process's current binding.
  const Topology whole = discover();
  const int cpu = *affinity().begin();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) _exit(10);
    const Topology t = discover();
    _exit(t.pus == whole.pus && t.cores.size() == whole.cores.size() ? 0 : 11);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10: setaffinity failed, 11: discover() saw fewer CPUs when bound";
}

TEST(Nvml, AbsentLibraryIsNoError) {
  const NvmlProbe p = probe_nvml("libnvidia-ml-absent.so.1", {"0000:18:00.0"});
  EXPECT_FALSE(p.used);
  EXPECT_NE(p.status.find("libnvidia-ml-absent.so.1 not found"), std::string::npos) << p.status;
  EXPECT_TRUE(p.domain_of_gpu.empty());
}

TEST(Nvml, LibraryWithoutNvmlSymbolsIsNoError) {
  // A real library that loads but is not NVML.
  const NvmlProbe p = probe_nvml("libm.so.6", {"0000:18:00.0"});
  EXPECT_FALSE(p.used);
  EXPECT_NE(p.status.find("NVML has no nvmlDeviceGetHandleByPciBusId_v2"), std::string::npos)
      << p.status;
}

TEST(Nvml, XmlOfADgxWithoutNvmlFallsBackToTheFile) {
  // Asking NVML for an XML's GPUs on a machine without NVML: the side file decides.
  Options o = dgx_options();
  o.use_nvml = true;
  o.nvml_library = "libnvidia-ml-absent.so.1";
  const Topology t = from_hwloc_xml(kDgx, o);
  EXPECT_NE(t.nvml_status.find("not found"), std::string::npos) << t.nvml_status;
  EXPECT_EQ(t.nvlink_domains.size(), 1u);
}

TEST(Infiniband, ReadsTheSysfsTree) {
  const auto devs = read_infiniband(kFixtures + "/dgx-h100-sys");
  ASSERT_EQ(devs.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(devs[i].name, "mlx5_" + std::to_string(i));
    EXPECT_EQ(devs[i].numa_os, i / 4);
    ASSERT_EQ(devs[i].ports.size(), 1u);
    EXPECT_EQ(devs[i].ports[0].state, "ACTIVE");
  }
  EXPECT_TRUE(read_infiniband("/nonexistent-sysfs").empty());
  EXPECT_DOUBLE_EQ(parse_rate_gbps("200 Gb/sec (4X HDR)"), 200);
  EXPECT_DOUBLE_EQ(parse_rate_gbps("2.5 Gb/sec (1X SDR)"), 2.5);
  EXPECT_DOUBLE_EQ(parse_rate_gbps("unknown"), 0);
}

TEST(Infiniband, RoceAndDevicesHwlocMissed) {
  // A device only sysfs knows (no PCI discovery), its port an Ethernet link
  // layer (RoCE), NUMA node 1 from sysfs.
  TempDir dir;
  const auto port = dir.path / "class/infiniband/mlx5_9/ports/1";
  std::filesystem::create_directories(port);
  std::filesystem::create_directories(dir.path / "class/infiniband/mlx5_9/device");
  std::ofstream(port / "rate") << "100 Gb/sec (4X EDR)\n";
  std::ofstream(port / "state") << "1: DOWN\n";
  std::ofstream(port / "link_layer") << "Ethernet\n";
  std::ofstream(dir.path / "class/infiniband/mlx5_9/device/numa_node") << "1\n";
  Options o;
  o.sysfs_root = dir.path.string();
  const Topology t = from_hwloc_xml(kCpu, o);
  ASSERT_EQ(t.nics.size(), 2u);
  EXPECT_EQ(t.nics[0].name, "mlx5_9");
  EXPECT_EQ(t.nics[0].kind, "roce");
  EXPECT_EQ(t.nics[0].numa, 1);
  EXPECT_EQ(t.nics[0].ports[0].state, "DOWN");
  EXPECT_EQ(t.nics[1].name, "eth0");
  // A malformed numa_node names its file.
  std::ofstream(dir.path / "class/infiniband/mlx5_9/device/numa_node") << "node one\n";
  EXPECT_NE(testing::message_of([&] {
              read_infiniband(dir.path.string());
            }).find("mlx5_9/device/numa_node"),
            std::string::npos);
}

TEST(NvlinkFile, Errors) {
  TempDir dir;
  const auto gpus = from_hwloc_xml(kDgx).gpus;
  auto err = [&](const std::string& text) {
    const std::string path = dir.file("nvlink.json", text);
    const std::string e = testing::message_of([&] { read_nvlink_file(path, gpus); });
    EXPECT_NE(e.find(path), std::string::npos) << e;
    return e;
  };
  EXPECT_NE(err("{not json").find("not JSON"), std::string::npos);
  EXPECT_NE(err("{\"domains\": []}").find("no array `nvlink_domains`"), std::string::npos);
  EXPECT_NE(
      err("{\"nvlink_domains\": [[\"0000:99:00.0\"]]}").find("0000:99:00.0, which is not a GPU"),
      std::string::npos);
  EXPECT_NE(
      err("{\"nvlink_domains\": [[0, 1], [1]]}").find("GPU 1 (0000:2a:00.0) is in domains 0 and 1"),
      std::string::npos);
  EXPECT_NE(err("{\"nvlink_domains\": [[8]]}").find("GPU index 8"), std::string::npos);
  EXPECT_NE(testing::message_of([&] {
              read_nvlink_file("/nonexistent/nvlink.json", gpus);
            }).find("/nonexistent/nvlink.json"),
            std::string::npos);
  // Indices and bus ids mix; GPUs not named get domains of their own.
  const std::string ok =
      dir.file("ok.json", "{\"nvlink_domains\": [[0, \"00000000:2A:00.0\"], [], [7, 6]]}");
  EXPECT_EQ(read_nvlink_file(ok, gpus), (std::vector<int>{0, 0, 2, 3, 4, 5, 1, 1}));
}

TEST(TopologyXml, HwlocNvlinkBandwidthMatrixGivesDomains) {
  // Give the DGX fixture hwloc's NVLinkBandwidth matrix (what hwloc's NVML
  // backend records on a real node): GPUs 0-3 linked pairwise, 4-7 linked
  // pairwise, nothing between the halves. Export it through hwloc, read it
  // back.
  hwloc_topology_t topo;
  ASSERT_EQ(hwloc_topology_init(&topo), 0);
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  ASSERT_EQ(hwloc_topology_set_xml(topo, kDgx.c_str()), 0);
  ASSERT_EQ(hwloc_topology_load(topo), 0);
  std::vector<hwloc_obj_t> nvml(8, nullptr);
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(topo, o));) {
    const std::string name = o->name;
    if (name.rfind("nvml", 0) == 0) nvml[std::stoi(name.substr(4))] = o;
  }
  std::vector<hwloc_uint64_t> values(64, 0);
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) values[i * 8 + j] = (i != j && i / 4 == j / 4) ? 100000 : 0;
  }
  hwloc_distances_add_handle_t h = hwloc_distances_add_create(
      topo, "NVLinkBandwidth",
      HWLOC_DISTANCES_KIND_FROM_USER | HWLOC_DISTANCES_KIND_MEANS_BANDWIDTH, 0);
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(hwloc_distances_add_values(topo, h, 8, nvml.data(), values.data(), 0), 0);
  ASSERT_EQ(hwloc_distances_add_commit(topo, h, 0), 0);
  char* xml = nullptr;
  int length = 0;
  ASSERT_EQ(hwloc_topology_export_xmlbuffer(topo, &xml, &length, 0), 0);
  const std::string text(xml);
  hwloc_free_xmlbuffer(topo, xml);
  hwloc_topology_destroy(topo);
  ASSERT_NE(text.find("NVLinkBandwidth"), std::string::npos);

  const Topology t = from_hwloc_xml(text);
  EXPECT_EQ(t.nvlink_source, "hwloc NVLinkBandwidth");
  ASSERT_EQ(t.nvlink_domains.size(), 2u);
  EXPECT_EQ(t.nvlink_domains[0], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.nvlink_domains[1], (std::vector<int>{4, 5, 6, 7}));
  // A side file, when given, is the stated truth and wins over the matrix.
  Options o;
  o.nvlink_file = kFixtures + "/dgx-h100.nvlink.json";
  EXPECT_EQ(from_hwloc_xml(text, o).nvlink_domains.size(), 1u);
}

TEST(TopologyXml, BadInputNamesTheFile) {
  TempDir dir;
  const std::string missing = (dir.path / "missing.xml").string();
  std::string e = testing::message_of([&] { from_hwloc_xml(missing); });
  EXPECT_NE(e.find("hwloc XML file " + missing + ": no such file"), std::string::npos) << e;

  const std::string bad = dir.file("bad.xml", "<topology version=\"2.0\"><object type=\"Machine\"");
  e = testing::message_of([&] { from_hwloc_xml(bad); });
  EXPECT_NE(e.find("hwloc XML file " + bad), std::string::npos) << e;
  EXPECT_NE(e.find("cannot"), std::string::npos) << e;

  const std::string not_xml = dir.file("topology.txt", "Machine (16GB)\n  Package L#0\n");
  e = testing::message_of([&] { from_hwloc_xml(not_xml); });
  EXPECT_NE(e.find(not_xml), std::string::npos) << e;

  e = testing::message_of([&] { from_hwloc_xml(dir.path.string()); });
  EXPECT_NE(e.find(dir.path.string() + ": not a regular file"), std::string::npos) << e;

  e = testing::message_of([&] { from_hwloc_xml("<topology><broken"); });
  EXPECT_NE(e.find("hwloc XML text"), std::string::npos) << e;

  Options o;
  o.nvlink_file = (dir.path / "no-such-nvlink.json").string();
  e = testing::message_of([&] { from_hwloc_xml(kDgx, o); });
  EXPECT_NE(e.find(o.nvlink_file), std::string::npos) << e;
}

TEST(Format, Ranges) {
  EXPECT_EQ(format_ranges({}), "");
  EXPECT_EQ(format_ranges({3}), "3");
  EXPECT_EQ(format_ranges({5, 0, 1, 2, 7, 8, 2}), "0-2,5,7-8");
  EXPECT_EQ(normalize_bus_id("00000000:DB:00.0"), "0000:db:00.0");
  EXPECT_EQ(normalize_bus_id("0000:18:00.0"), "0000:18:00.0");
  EXPECT_EQ(normalize_bus_id("18:00.0"), "");
  EXPECT_EQ(normalize_bus_id("0000:18:00.0x"), "");
}

}  // namespace
}  // namespace kolos::topology
