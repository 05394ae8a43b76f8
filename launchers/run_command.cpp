// `kolos run`: checks the config as every rank will (with parallel.auto,
// what can be checked before the planner chooses), then starts N local
// ranks of `kolos train` through mpirun (launch.h).
#include "run_command.h"

#include <boost/program_options.hpp>

#include "auto_plan.h"
#include "check_command.h"
#include "command_options.h"
#include "kolos/config.h"
#include "kolos/core/config_located.h"
#include "kolos/core/error.h"
#include "kolos/core/malloc_tuning.h"
#include "kolos/core/run_config.h"
#include "kolos/modules/gpt.h"
#include "launch.h"

namespace po = boost::program_options;

namespace kolos::cli {

int run_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  LaunchOptions launch;
  options.add_options()("np,n", po::value(&launch.ranks)->required(), "number of ranks")(
      "config", po::value(&launch.config)->required(), "the run's TOML file")(
      "set", po::value(&launch.overrides)->composing(), "override a key: --set train.steps=100")(
      "mpirun", po::value(&launch.mpirun)->default_value(KOLOS_MPIEXEC), "mpirun to use")(
      "no-ucx", po::bool_switch(&launch.no_ucx), "never select MPI's UCX transport")(
      "ucx", po::bool_switch(&launch.ucx),
      "always select MPI's UCX transport (default: when there are 2+ cores per rank)")(
      "bind", po::value(&launch.bind),
      "none | cores | numa: bind each rank to cores of its own or to its NUMA node (default: cores "
      "when there is a core per rank, else none)")(
      "dry-run", po::bool_switch(&launch.dry_run), "print the mpirun command, run nothing")(
      "resume", po::value<std::string>()->implicit_value(""),
      "pass --resume [DIR] to every rank's `kolos train`")("resume-dir",
                                                           po::value(&launch.resume_dir), "");
  po::positional_options_description positional;
  positional.add("config", 1).add("resume-dir", 1);  // `CONFIG --resume DIR`
  Parsed parsed =
      parse("run", args, options, positional, "-n N CONFIG [--set key=value ...] [--resume [DIR]]");
  if (parsed.help) return 0;
  launch.resume = parsed.vm.count("resume") > 0;
  if (launch.resume && launch.resume_dir.empty()) {
    launch.resume_dir = parsed.vm["resume"].as<std::string>();
  }
  if (!launch.resume_dir.empty() && !launch.resume) {
    throw UsageError("kolos run: unexpected argument `" + launch.resume_dir +
                     "` (see `kolos run --help`)");
  }
  // Check the config here, as every rank will, so a typo fails before any
  // rank starts.
  mpirun_command(launch);  // the launch options (-n) first
  training_malloc();       // KOLOS_MALLOC, which every rank reads
  const RunConfig config = load_run_config(launch.config, launch.overrides);
  if (config.parallel.auto_plan) {
    // The layout is the planner's to choose once the ranks run: check what
    // can be checked before (the config, the planner and its keys).
    modules::register_builtin_models();
    check_model_name(config);
    make_planner(config)->check(config);
  } else {
    check_run(config, launch.ranks);
  }
  return exec_mpirun(launch);
}

}  // namespace kolos::cli
