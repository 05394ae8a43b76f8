// `kolos run`: N local ranks of `kolos train` through mpirun, with the flags
// these machines need (see docs/launching.md).
#pragma once

#include <string>
#include <vector>

namespace kolos::cli {

struct LaunchOptions {
  int ranks = 0;
  std::string config;
  std::vector<std::string> overrides;
  std::string mpirun;
  std::string kolos;    // the kolos executable to start; empty: this one
  std::string command = "train";  // the kolos command every rank runs
  std::vector<std::string> extra;  // arguments after the config (before --set)
  bool resume = false;  // pass --resume [resume_dir] to kolos train
  std::string resume_dir;
  bool no_ucx = false;  // never select MPI's UCX transport
  bool ucx = false;     // always select it (default: only with 2+ cores per rank)
  bool dry_run = false;
  // Rank binding: "none", "cores" (each rank its own cores, ranks in blocks
  // per NUMA node) or "numa" (each rank its NUMA node); empty: cores when the
  // machine has a core per rank, else none.
  std::string bind;
  int cores = 0;  // 0: the CPUs this process may use (sizes the thread pools)
  // The machine as hwloc sees it (exec_mpirun fills these from
  // kolos::topology::discover()); 0: assume cores, in one NUMA node.
  int physical_cores = 0;  // cores, not hardware threads: what OpenMPI binds to
  int numa_nodes = 0;      // NUMA nodes with cores
  int cores_per_numa = 0;  // the fewest cores of any of them
  bool root = false;       // set from the effective uid when building for real
};

// The binding the command uses: options.bind, or its default. Throws
// UsageError for an unknown policy, and for `cores` with more ranks than
// cores (once cores or physical_cores says how many there are).
std::string resolve_bind(const LaunchOptions& options);

// One line for people: the policy and what it gives each rank, e.g.
// "binding cores: 2 ranks, 1 NUMA node(s), 2 per NUMA node, 1 core(s) each".
std::string describe_binding(const LaunchOptions& options);

// The path of the running executable (/proc/self/exe), or "kolos" when it
// cannot be read: what `kolos run` and `kolos slurm gen` start by default.
std::string self_executable();

// Whether the command selects MPI's UCX transport: --ucx, or by default when
// every rank has a spare core for its communication thread.
bool use_ucx(const LaunchOptions& options);

// The argv of the mpirun command. Throws UsageError when ranks < 1.
std::vector<std::string> mpirun_command(const LaunchOptions& options);

// Builds the command and replaces this process with it (or prints it for a
// dry run). Returns only on failure or dry run.
int exec_mpirun(LaunchOptions options);

// As exec_mpirun, in a child process: waits for it and returns its exit
// status (128 + the signal when a signal ended it).
int spawn_mpirun(LaunchOptions options);

}  // namespace kolos::cli
