// `kolos plugins`: the plugin search path and the plugins found there, with
// their role, versions and refusals; `kolos topo`: this node's cores, NUMA
// nodes, GPUs, NICs and NVLink domains (libkolos_topology), and the binding
// of N node-local ranks; `kolos version`: the versions of kolos and of what
// it was built with, and the GPUs it sees.
#include "info_command.h"

#include <mpi.h>

#include <boost/program_options.hpp>
#include <iostream>

#include "command_options.h"
#include "kolos/config.h"
#include "kolos/core/devices.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/topology/binding.h"
#include "kolos/topology/topology.h"

namespace po = boost::program_options;

namespace kolos::cli {

int plugins_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  std::vector<std::string> paths;
  options.add_options()("path", po::value(&paths)->composing(),
                        "a directory to search first (repeatable)");
  Parsed parsed = parse("plugins", args, options, {}, "[--path DIR ...]");
  if (parsed.help) return 0;
  PluginRegistry registry(paths);
  std::cout << "searched:";
  for (const auto& dir : registry.search_path()) std::cout << ' ' << dir;
  std::cout << "\n\n" << format_plugin_table(registry.scan());
  return 0;
}

int topo_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  bool json = false, gpus = false;
  int ranks = 0;
  topology::Options from;
  std::string xml;
  options.add_options()("json", po::bool_switch(&json), "print JSON instead of text")(
      "xml", po::value(&xml), "read an hwloc XML export (lstopo FILE.xml) instead of this machine")(
      "nvlink-file", po::value(&from.nvlink_file),
      "NVLink domains when NVML is absent (JSON, docs/topology.md; default $KOLOS_NVLINK_FILE)")(
      "sysfs-root", po::value(&from.sysfs_root),
      "where class/infiniband is read (default /sys for this machine, none for --xml)")(
      "ranks", po::value(&ranks), "also print the binding of this many node-local ranks")(
      "gpus", po::bool_switch(&gpus), "with --ranks: one rank per GPU, on its GPU's NUMA node");
  Parsed parsed =
      parse("topo", args, options, {},
            "[--json] [--xml FILE] [--nvlink-file FILE] [--sysfs-root DIR] [--ranks N [--gpus]]");
  if (parsed.help) return 0;
  topology::Topology t;
  if (xml.empty()) {
    from.use_nvml = true;
    if (from.sysfs_root.empty()) from.sysfs_root = "/sys";
    t = topology::discover(from);
  } else {
    t = topology::from_hwloc_xml(xml, from);
  }
  if (json) {
    std::cout << topology::to_json(t);
    return 0;
  }
  std::cout << topology::to_text(t);
  if (ranks > 0) {
    for (const auto& b : topology::bindings_for(ranks, t, {gpus})) {
      std::cout << "  " << topology::describe(b, t) << "\n";
    }
  }
  return 0;
}

int version_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  Parsed parsed = parse("version", args, options, {}, "");
  if (parsed.help) return 0;
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(mpi, &length);
  std::string mpi_line(mpi, length);
  mpi_line = mpi_line.substr(0, mpi_line.find_first_of("\n,"));
  std::cout << "kolos " << KOLOS_VERSION << " (" << KOLOS_BUILD_TYPE << ")\n"
            << "  LibTorch  " << KOLOS_TORCH_VERSION << "\n"
            << "  compiler  " << KOLOS_COMPILER << "\n"
            << "  MPI       " << mpi_line << "\n"
            << "  plugin ABI " << KOLOS_PLUGIN_ABI_VERSION << "\n"
            << "  CUDA " << (KOLOS_CUDA_ENABLED ? "on" : "off") << ", NCCL "
            << (KOLOS_WITH_NCCL ? "on" : "off") << "\n";
  const int gpus = cuda::device_count();
  std::cout << "  GPUs      " << gpus;
  for (int d = 0; d < gpus; ++d) std::cout << (d ? ", " : " (") << cuda::device_name(d);
  std::cout << (gpus ? ")\n" : "\n");
  return 0;
}

}  // namespace kolos::cli
