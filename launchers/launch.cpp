#include "launch.h"

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <iostream>

#include "kolos/config.h"
#include "kolos/core/error.h"

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
  if (!KOLOS_WITH_UCX || o.no_ucx) return false;
  if (o.ucx) return true;
  // Measured on 2 cores, 2 ranks, a GPT step: 209 ms with UCX, 90 ms with
  // MPI's default transport; UCX's polling takes the core backward needs.
  const int cores = o.cores > 0 ? o.cores : 1;
  return cores >= 2 * o.ranks;
}

std::vector<std::string> mpirun_command(const LaunchOptions& o) {
  if (o.ranks < 1) {
    throw UsageError("kolos run: -n must be at least 1, got " + std::to_string(o.ranks));
  }
  const int cores = o.cores > 0 ? o.cores : 1;
  std::vector<std::string> cmd = {o.mpirun, "-np", std::to_string(o.ranks)};
  if (o.root) cmd.push_back("--allow-run-as-root");
  if (o.ranks > cores) {
    // More ranks than cores: let ranks share cores.
    cmd.insert(cmd.end(), {"--oversubscribe", "--bind-to", "none"});
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
  // The watchdog's deadline and the plugin-trust override reach every rank
  // (remote ones too) when they are set here.
  for (const char* name : {"KOLOS_COMM_TIMEOUT_S", "KOLOS_ALLOW_INSECURE_PLUGINS"}) {
    if (std::getenv(name) != nullptr) cmd.insert(cmd.end(), {"-x", name});
  }
  cmd.push_back(o.kolos.empty() ? self_executable() : o.kolos);
  cmd.insert(cmd.end(), {"train", o.config});
  for (const auto& s : o.overrides) cmd.insert(cmd.end(), {"--set", s});
  if (o.resume) {
    cmd.push_back("--resume");
    if (!o.resume_dir.empty()) cmd.push_back(o.resume_dir);
  }
  return cmd;
}

int exec_mpirun(LaunchOptions o) {
  if (o.cores <= 0) o.cores = usable_cores();
  o.root = geteuid() == 0;
  if (std::getenv("KOLOS_PLUGIN_PATH") == nullptr) setenv("KOLOS_PLUGIN_PATH", "", 0);
  std::vector<std::string> cmd = mpirun_command(o);
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

}  // namespace kolos::cli
