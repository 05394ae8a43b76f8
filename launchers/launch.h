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
  std::string kolos;  // the kolos executable to start; empty: this one
  bool resume = false;     // pass --resume [resume_dir] to kolos train
  std::string resume_dir;
  bool no_ucx = false;  // never select MPI's UCX transport
  bool ucx = false;     // always select it (default: only with 2+ cores per rank)
  bool dry_run = false;
  int cores = 0;      // 0: the cores this process may use
  bool root = false;  // set from the effective uid when building for real
};

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

}  // namespace kolos::cli
