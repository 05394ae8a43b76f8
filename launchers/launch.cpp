#include "launch.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "kolos/core/error.h"
#include "kolos/topology/topology.h"

namespace kolos::cli {
namespace {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

std::string quote(const std::string& word) {
  if (word.find_first_of(" \t\"'$\\") == std::string::npos && !word.empty()) return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string self_executable() {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "kolos";
  path[n] = '\0';
  return path;
}

bool use_ucx(const LaunchOptions& o) {
  if (o.no_ucx) return false;
  if (o.ucx) return true;
  // Measured on 2 cores, 2 ranks, a GPT step: 209 ms with UCX, 90 ms with
  // MPI's default transport; UCX's polling takes the core backward needs.
  const int cores = o.cores > 0 ? o.cores : 1;
  return cores >= 2 * o.ranks;
}

namespace {

// The machine's shape for binding, with the defaults LaunchOptions documents.
struct Shape {
  int cores;           // physical cores: OpenMPI's slots and binding units
  int numa;            // NUMA nodes with cores
  int cores_per_numa;  // the fewest of any
  int per_numa;        // ranks per NUMA node in block placement: ceil(ranks / numa)
  int pe;              // cores per rank under `cores`
};

Shape shape_of(const LaunchOptions& o) {
  Shape s;
  s.cores = o.physical_cores > 0 ? o.physical_cores : std::max(1, o.cores);
  s.numa = std::max(1, o.numa_nodes);
  s.cores_per_numa = o.cores_per_numa > 0 ? o.cores_per_numa : std::max(1, s.cores / s.numa);
  const int ranks = std::max(1, o.ranks);
  s.per_numa = (ranks + s.numa - 1) / s.numa;
  s.pe = s.per_numa <= s.cores_per_numa
             ? std::max(1, std::min(s.cores_per_numa / s.per_numa, s.cores / ranks))
             : std::max(1, s.cores / ranks);
  return s;
}

}  // namespace

std::string resolve_bind(const LaunchOptions& o) {
  const Shape s = shape_of(o);
  if (o.bind.empty()) return o.ranks <= s.cores ? "cores" : "none";
  if (o.bind != "none" && o.bind != "cores" && o.bind != "numa") {
    throw UsageError("kolos run: --bind must be none, cores or numa, got `" + o.bind + "`");
  }
  // Before exec_mpirun has looked at the machine (kolos run checks its
  // options first), only the policy's name can be checked.
  const bool machine_known = o.cores > 0 || o.physical_cores > 0;
  if (o.bind == "cores" && machine_known && o.ranks > s.cores) {
    throw UsageError("kolos run: --bind cores gives each rank a core of its own, but " +
                     std::to_string(o.ranks) + " ranks do not fit on " + std::to_string(s.cores) +
                     " cores (use --bind numa or --bind none)");
  }
  return o.bind;
}

std::string describe_binding(const LaunchOptions& o) {
  const Shape s = shape_of(o);
  const std::string bind = resolve_bind(o);
  std::string line = "binding " + bind + (o.bind.empty() ? " (default)" : "") + ": " +
                     std::to_string(o.ranks) + " ranks, " + std::to_string(s.cores) + " cores in " +
                     std::to_string(s.numa) + " NUMA node(s)";
  if (bind == "cores") {
    line += s.per_numa <= s.cores_per_numa
                ? ", up to " + std::to_string(s.per_numa) + " consecutive ranks per NUMA node, " +
                      std::to_string(s.pe) + " core(s) each"
                : ", " + std::to_string(s.pe) + " core(s) each, in rank order";
  } else if (bind == "numa") {
    line += ", up to " + std::to_string(s.per_numa) +
            " consecutive ranks per NUMA node, each bound to its node";
  } else {
    line += o.ranks > s.cores ? ", more ranks than cores: not bound, cores shared" : ", not bound";
  }
  return line;
}

std::vector<std::string> mpirun_command(const LaunchOptions& o) {
  if (o.ranks < 1) {
    throw UsageError("kolos run: -n must be at least 1, got " + std::to_string(o.ranks));
  }
  const int cores = o.cores > 0 ? o.cores : 1;
  const Shape shape = shape_of(o);
  const std::string bind = resolve_bind(o);
  std::vector<std::string> cmd = {o.mpirun, "-np", std::to_string(o.ranks)};
  if (o.root) cmd.push_back("--allow-run-as-root");
  // OpenMPI counts a slot per core: more ranks than cores need
  // --oversubscribe, and only the unbound or NUMA policies allow it.
  const bool oversubscribed = o.ranks > shape.cores;
  if (oversubscribed) cmd.push_back("--oversubscribe");
  const std::string per_numa = "ppr:" + std::to_string(shape.per_numa) + ":numa";
  if (bind == "cores") {
    // Consecutive ranks (the mesh's tp peers) on one NUMA node, each on
    // PE cores of its own; with NUMA nodes too small for their block, plain
    // rank order over the cores.
    const std::string pe = ":PE=" + std::to_string(shape.pe);
    cmd.insert(cmd.end(),
               {"--map-by", (shape.per_numa <= shape.cores_per_numa ? per_numa : "slot") + pe,
                "--bind-to", "core"});
  } else if (bind == "numa") {
    cmd.insert(cmd.end(),
               {"--map-by", per_numa, "--bind-to",
                shape.per_numa > shape.cores_per_numa ? "numa:overload-allowed" : "numa"});
  } else {
    cmd.insert(cmd.end(), {"--bind-to", "none"});
  }
  // Each rank has a compute thread and a communication thread; a blocking
  // MPI call polling without yielding would take the core backward needs.
  cmd.insert(cmd.end(), {"--mca", "mpi_yield_when_idle", "1"});
  if (use_ucx(o)) {
    // UCX is not picked by default without InfiniBand; its all_reduce is ~3x
    // faster here, but its progress polls hard: only with a spare core per
    // rank for the communication thread (see use_ucx).
    cmd.insert(cmd.end(), {"--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca",
                           "pml_ucx_devices", "any"});
  }
  const int threads = std::max(1, cores / o.ranks);
  cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(threads)});
  // One BLAS thread: LibTorch's pool parallelises (see runtime.cpp).
  cmd.insert(cmd.end(), {"-x", "OPENBLAS_NUM_THREADS=1"});
  cmd.insert(cmd.end(), {"-x", "KOLOS_PLUGIN_PATH"});
  // The watchdog's deadline, the plugin-trust override and the planner's
  // cache directory reach every rank
  // (remote ones too) when they are set here.
  for (const char* name : {"KOLOS_COMM_TIMEOUT_S", "KOLOS_ALLOW_INSECURE_PLUGINS", "KOLOS_CACHE_DIR"}) {
    if (std::getenv(name) != nullptr) cmd.insert(cmd.end(), {"-x", name});
  }
  cmd.push_back(o.kolos.empty() ? self_executable() : o.kolos);
  cmd.insert(cmd.end(), {o.command, o.config});
  cmd.insert(cmd.end(), o.extra.begin(), o.extra.end());
  for (const auto& s : o.overrides) cmd.insert(cmd.end(), {"--set", s});
  if (o.resume) {
    cmd.push_back("--resume");
    if (!o.resume_dir.empty()) cmd.push_back(o.resume_dir);
  }
  return cmd;
}

namespace {

// What both launches do first: the machine's cores and NUMA nodes.
void look_at_machine(LaunchOptions& o) {
  if (o.cores <= 0) o.cores = usable_cores();
  o.root = geteuid() == 0;
  if (std::getenv("KOLOS_PLUGIN_PATH") == nullptr) setenv("KOLOS_PLUGIN_PATH", "", 0);
  if (o.physical_cores <= 0) {
    try {
      const topology::Topology t = topology::discover();
      o.physical_cores = static_cast<int>(t.cores.size());
      o.numa_nodes = 0;
      o.cores_per_numa = 0;
      for (const auto& node : t.numa_nodes) {
        if (node.cores.empty()) continue;
        ++o.numa_nodes;
        const int n = static_cast<int>(node.cores.size());
        o.cores_per_numa = o.cores_per_numa == 0 ? n : std::min(o.cores_per_numa, n);
      }
    } catch (const Error& e) {
      std::cerr << "kolos run: warning: " << e.what() << "; binding as if one NUMA node had "
                << o.cores << " cores\n";
    }
  }
}

}  // namespace

int exec_mpirun(LaunchOptions o) {
  look_at_machine(o);
  std::vector<std::string> cmd = mpirun_command(o);
  std::cerr << "kolos run: " << describe_binding(o) << "\n";
  if (o.dry_run) {
    for (size_t i = 0; i < cmd.size(); ++i) std::cout << (i ? " " : "") << quote(cmd[i]);
    std::cout << "\n";
    return 0;
  }
  std::vector<char*> argv;
  for (auto& word : cmd) argv.push_back(word.data());
  argv.push_back(nullptr);
  std::cout.flush();
  execvp(argv[0], argv.data());
  throw UsageError("kolos run: cannot start `" + cmd[0] + "`: " + std::strerror(errno) +
                   " (is OpenMPI installed? pass --mpirun PATH)");
}

int spawn_mpirun(LaunchOptions o) {
  look_at_machine(o);
  std::vector<std::string> cmd = mpirun_command(o);
  std::vector<char*> argv;
  for (auto& word : cmd) argv.push_back(word.data());
  argv.push_back(nullptr);
  std::cout.flush();
  std::cerr.flush();
  const pid_t child = fork();
  if (child < 0) throw Error(std::string("cannot fork: ") + std::strerror(errno));
  if (child == 0) {
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "kolos: cannot start `%s`: %s (is OpenMPI installed?)\n", argv[0],
                 std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) throw Error(std::string("waitpid: ") + std::strerror(errno));
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace kolos::cli
