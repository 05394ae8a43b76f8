// The `kolos` command line.
//
//   kolos train CONFIG [--set k=v ...]      one rank's part of a job (mpirun/srun start it)
//   kolos run -n N CONFIG [--set k=v ...]   N local ranks through mpirun
//   kolos check CONFIG [-n N] [--set k=v]   every check a run makes before it communicates
//   kolos plan CONFIG -n N [--cluster F]    the best plans by the planner role (kolos/core/planner.h)
//   kolos plan --memory CONFIG -n N         the per-rank memory estimate, as a table
//   kolos calibrate CONFIG -n N             measure this machine for the planner (N ranks at once)
//   kolos plugins [--path DIR ...]          plugins found, their role and versions
//   kolos data prepare FILE... -o OUT       byte-level token file from text
//         [--tokenizer PATH]              ... or tokenizer.json / tokenizer.model ids
//   kolos data prepare --images DIR -o OUT  images file from PNG/JPEG class folders or .npy
//   kolos slurm gen [CONFIG] [options]      a ready sbatch script (launchers/slurm_command.cpp)
//   kolos topo [--json]                     this node's topology (libkolos_topology)
//   kolos version
//
// Each command's code is in its own file (train_command.cpp, plan_command.cpp,
// ...; the planner inside a job: auto_plan.cpp); this file holds the usage
// text and the dispatch to them.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "check_command.h"
#include "ckpt_command.h"
#include "data_command.h"
#include "generate_command.h"
#include "info_command.h"
#include "kolos/core/error.h"
#include "kolos/core/runtime.h"
#include "kolos/core/settings.h"
#include "plan_command.h"
#include "run_command.h"
#include "sample_command.h"
#include "serve_command.h"
#include "slurm_command.h"
#include "train_command.h"

namespace kolos::cli {
namespace {

constexpr const char* kUsage = R"(usage: kolos <command> [options]

commands:
  train CONFIG [--set key=value ...]     train; one rank's part of a job (run under mpirun/srun)
  run -n N CONFIG [--set key=value ...]  launch N local ranks of `kolos train` through mpirun
  check CONFIG [-n N] [--set key=value]  check a config as a run of N ranks would, start nothing
  plan CONFIG -n N [--cluster FILE]      the best parallel layouts for N ranks, predicted
         [--tune K]                     ... the best K tried for a few steps, the fastest measured
  plan --memory CONFIG -n N              print the per-rank memory estimate and whether it fits
  calibrate CONFIG -n N                  measure this machine for the planner (cached)
  plugins [--path DIR ...]               list the plugins found, their role, versions, refusals
  data prepare FILE... -o OUT            write a byte-level token file for [data] kind = "tokens"
         [--tokenizer PATH]             ... or the ids of a tokenizer.json / tokenizer.model
  data prepare --images DIR -o OUT.h5    an images file for [data] kind = "images" from PNG/JPEG
         [--images X.npy --labels Y.npy] ... or from NumPy arrays
  ckpt inspect|verify|export DIR         look into, check or export a checkpoint
  generate CKPT --prompt-ids IDS [-n N]  continue prompts from a checkpoint or HF model (paged KV cache)
  serve CKPT [--port P] [-n N]           an OpenAI-style /v1/completions server over the same engine
  sample CKPT --classes 0,1 -o grid.png  draw images from a diffusion (dit) checkpoint as a PNG grid
  slurm gen [CONFIG] [options]           write an sbatch script (srun, requeue on time limit)
  topo [--json]                          this node's cores, NUMA nodes, GPUs, NICs, NVLink domains
  version                                versions of kolos and what it was built with

`kolos <command> --help` describes each command.
)";

int dispatch(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  if (command == "--version") return version_command({});
  if (command == "train") return train_command(args, argc, argv);
  if (command == "run") return run_command(args);
  if (command == "check") return check_command(args);
  if (command == "plan") return plan_command(args, argc, argv);
  if (command == "calibrate") return calibrate_command(args, argc, argv);
  if (command == "plugins") return plugins_command(args);
  if (command == "data") return data_command(args);
  if (command == "ckpt") return ckpt_command(args);
  if (command == "generate") return generate_command(args, argc, argv);
  if (command == "serve") return serve_command(args, argc, argv);
  if (command == "sample") return sample_command(args);
  if (command == "slurm") return slurm_command(args);
  if (command == "topo") return topo_command(args);
  if (command == "version") return version_command(args);
  std::string hint = closest_match(command, {"train", "run", "check", "plan", "calibrate", "plugins", "data",
                                             "ckpt", "generate", "serve", "sample", "slurm", "topo",
                                             "version"});
  throw UsageError("unknown command `" + command + "`" +
                   (hint.empty() ? "" : " (did you mean `" + hint + "`?)") +
                   "; see `kolos --help`");
}

}  // namespace
}  // namespace kolos::cli

int main(int argc, char** argv) {
  try {
    return kolos::cli::dispatch(argc, argv);
  } catch (const kolos::Error& e) {
    std::fprintf(stderr, "kolos: %s: %s\n", kolos::to_string(e.kind()), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolos: error: %s\n", kolos::error_text(e));
    return 1;
  }
}
