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
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <boost/program_options.hpp>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt_command.h"
#include "generate_command.h"
#include "sample_command.h"
#include "serve_command.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/config.h"
#include "kolos/core/config_located.h"
#include "kolos/core/devices.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/format.h"
#include "kolos/core/memory_estimate.h"
#include "kolos/core/planner.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/run_config.h"
#include "kolos/core/runtime.h"
#include "kolos/core/signals.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"
#include "kolos/tokenizer/token_file.h"
#include "kolos/topology/binding.h"
#include "kolos/topology/locality.h"
#include "kolos/topology/topology.h"
#include "launch.h"
#include "slurm_command.h"
#include "tune.h"

namespace po = boost::program_options;

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

// What a run checks on each rank before it communicates (plan_run), and
// that the model exists; the data is opened only by the run.
RunPlan check_run(const RunConfig& config, int64_t ranks) {
  modules::register_builtin_models();
  check_model_name(config);
  return plan_run(config, ranks);
}

struct Parsed {
  po::variables_map vm;
  bool help = false;
};

Parsed parse(const std::string& command, const std::vector<std::string>& args,
             const po::options_description& options,
             const po::positional_options_description& positional, const char* synopsis) {
  po::options_description all = options;
  all.add_options()("help,h", "show this help");
  Parsed parsed;
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), parsed.vm);
    if (parsed.vm.count("help")) {
      std::cout << "usage: kolos " << command << " " << synopsis << "\n\n" << all << "\n";
      parsed.help = true;
      return parsed;
    }
    po::notify(parsed.vm);
  } catch (const po::error& e) {
    throw UsageError("kolos " + command + ": " + e.what() + " (see `kolos " + command +
                     " --help`)");
  }
  return parsed;
}

std::string format_summary(const TrainSummary& s, const Engine& engine) {
  char line[512];
  std::snprintf(line, sizeof line,
                "kolos: done: %lld steps in %.1f s | loss %.4f -> %.4f | %s tokens/s | peak RSS "
                "%s per rank | mesh %s | ",
                (long long)s.steps, s.seconds, s.first_loss, s.final_loss,
                detail::format_count(s.tokens_per_s).c_str(),
                detail::format_bytes(static_cast<double>(s.peak_rss_bytes)).c_str(),
                engine.mesh().layout().describe().c_str());
  // The memory role serves in the gradients role's place, with ZeRO's
  // stage over its own chunks.
  if (!engine.roles().memory.empty()) {
    const int64_t stage = engine.config().parallel.zero.stage;
    return std::string(line) + "memory " + engine.roles().memory +
           (stage > 0 ? " (ZeRO-" + std::to_string(stage) + " over its chunks)" : "");
  }
  return std::string(line) + "gradients " + engine.roles().gradients;
}

// The hosts of the world's ranks, by rank (KOLOS_SIMULATED_HOSTS stands in
// for them). Collective.
std::vector<std::string> rank_hosts(const Runtime& runtime);

// Whether the mesh's tp and sp groups stay inside a node, from every rank's
// host name (libkolos_topology's check_locality): warnings on rank 0.
// KOLOS_SIMULATED_HOSTS (one name per rank, comma-separated) stands in for
// the host names, to check a multi-node layout on one machine. Collective.
void report_locality(const Runtime& runtime, const MeshShape& shape) {
  const topology::LocalityReport report = topology::check_locality(shape, rank_hosts(runtime));
  if (runtime.rank() != 0) return;
  for (const auto& warning : report.warnings()) {
    std::fprintf(stderr, "kolos: warning: %s\n", warning.c_str());
  }
  // On more than one node the log says where the groups are, also when all
  // is well ("tp and sp groups stay inside one node ...").
  if (report.nodes > 1 && report.findings.empty()) {
    std::stringstream lines(report.summary());
    for (std::string line; std::getline(lines, line);) {
      std::fprintf(stderr, "kolos: locality: %s\n", line.c_str());
    }
  }
}

std::vector<std::string> rank_hosts(const Runtime& runtime) {
  constexpr int kName = 256;
  std::vector<char> mine(kName, '\0');
  gethostname(mine.data(), kName - 1);
  std::vector<char> all(static_cast<size_t>(kName) * runtime.size(), '\0');
  MPI_Allgather(mine.data(), kName, MPI_CHAR, all.data(), kName, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> hosts;
  for (int r = 0; r < runtime.size(); ++r) hosts.emplace_back(all.data() + r * kName);
  if (const char* simulated = std::getenv("KOLOS_SIMULATED_HOSTS")) {
    std::vector<std::string> names;
    std::stringstream in(simulated);
    for (std::string name; std::getline(in, name, ',');) names.push_back(name);
    if (static_cast<int>(names.size()) != runtime.size()) {
      throw UsageError("KOLOS_SIMULATED_HOSTS names " + std::to_string(names.size()) +
                       " host(s) for " + std::to_string(runtime.size()) +
                       " ranks; give one name per rank, comma-separated");
    }
    hosts = names;
  }
  return hosts;
}

// The planner role's plugin for `config` ([plugins] planner, else `autoplan`),
// configured from its [planner] section.
std::shared_ptr<Planner> make_planner(const RunConfig& config) {
  PluginRegistry registry(config.plugins.path);
  const RoleChoice choice = choose_plugins(config);
  const std::string name = choice.planner.empty() ? "autoplan" : choice.planner;
  std::shared_ptr<Planner> planner = registry.create<Planner>("planner", name);
  const RoleSpec& spec = role_spec("planner");
  planner->configure(PluginContext{config, config.section(spec.section), spec.core_keys,
                                   "planner plugin `" + name + "`", MeshShape{}, 1});
  return planner;
}

// rank 0's string on every rank of the world.
std::string broadcast_string(std::string text) {
  long long size = static_cast<long long>(text.size());
  MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  text.resize(static_cast<size_t>(size));
  if (size > 0) MPI_Bcast(text.data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD);
  return text;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

// Measures this machine for the planner (collective): its rates, then
// reference runs of the config's model whose measured steps the planner
// compares with its predictions: data parallel over every rank (the step
// factor), then, where the ranks make a group of 4, tensor 2d over 4 and
// ring attention over 4 at 2 sequences per micro-batch, so that neither is
// a plan `run_planner_check.sh` measures (what each of their many small
// collectives costs beyond the model when ranks share cores). Rank 0
// records them, in that order, once every rank is done with the runs.
void calibrate_machine(const Runtime& runtime, Planner& planner, const std::string& path,
                       std::vector<std::string> overrides, const RunConfig& config) {
  planner.calibrate(runtime.world(), config);
  for (const char* o : {"parallel.auto=false", "parallel.data=0", "parallel.tensor.size=1",
                        "parallel.pipeline.size=1", "parallel.sequence.size=1",
                        "parallel.zero.stage=0", "train.recompute=\"none\"", "train.steps=6",
                        "log.metrics=\"\"", "log.progress=\"off\"", "checkpoint.dir=\"\""}) {
    overrides.push_back(o);
  }
  // Without a reference run (the config fixes a mode that needs a size
  // the reference does not have, or the model does not fit the layout)
  // its figure is not measured; every rank reads the same config, so every
  // rank decides alike, and the engine's refusals are agreed.
  std::vector<std::pair<RunConfig, double>> measured;
  const auto reference = [&](const std::string& name, const std::vector<std::string>& layout) {
    std::vector<std::string> o = overrides;
    o.insert(o.end(), layout.begin(), layout.end());
    std::string skipped;
    RunConfig run;
    try {
      run = load_run_config(path, o);
    } catch (const Error& e) {
      skipped = e.what();
    }
    std::vector<double> times;
    if (skipped.empty()) {
      try {
        Engine engine(run, runtime.world(),
                      [](const RunConfig& c) { return data::make_source(c); });
        engine.train([&](const StepMetrics& m) { times.push_back(m.step_time_s); });
      } catch (const AgreedError& e) {
        skipped = e.what();
      }
    }
    if (runtime.rank() != 0) return;
    if (!skipped.empty()) {
      std::fprintf(stderr, "kolos: calibration: no %s reference run (%s)\n", name.c_str(),
                   skipped.substr(0, skipped.find('\n')).c_str());
      return;
    }
    // The steps after the first two (allocation, first touches).
    std::vector<double> steady(times.begin() + std::min<size_t>(2, times.size()), times.end());
    std::sort(steady.begin(), steady.end());
    if (!steady.empty()) measured.emplace_back(run, steady[steady.size() / 2]);
  };
  reference("data-parallel", {});
  if (runtime.size() % 4 == 0) {
    const std::string rest = "parallel.data=" + std::to_string(runtime.size() / 4);
    reference("tensor 2d", {rest, "parallel.tensor.size=4", "parallel.tensor.mode=\"2d\"",
                            "train.micro_batch=2"});
    reference("ring attention", {rest, "parallel.sequence.size=4",
                                 "parallel.sequence.mode=\"ring\"", "train.micro_batch=2"});
  }
  for (const auto& [run, seconds] : measured)
    planner.record_reference(run, runtime.size(), seconds);
}

// parallel.auto = true: the planner chooses the layout on rank 0 (this
// machine calibrated first, once, by every rank together), every rank
// loads the config with the plan's overrides, and rank 0 says what it chose.
// Collective; errors are agreed. Returns the resolved config; `header` gets
// the metrics file's header (the plan as JSON).
RunConfig resolve_auto_plan(const Runtime& runtime, const std::string& path,
                            std::vector<std::string> overrides, const RunConfig& config,
                            std::string* header) {
  comm::ProcessGroup& world = *runtime.world();
  const int64_t ranks = runtime.size();
  std::shared_ptr<Planner> planner;
  agreed(world, [&] {
    planner = make_planner(config);
    planner->check(config);
    std::set<std::string> hosts;
    for (const auto& h : rank_hosts(runtime)) hosts.insert(h);
    if (hosts.size() > 1 && planner->needs_calibration()) {
      throw ConfigError(located(config, "parallel.auto",
                                "parallel.auto = true on " + std::to_string(hosts.size()) +
                                    " hosts needs a cluster file ([planner] cluster = FILE): "
                                    "the calibration measures one node, not the network "
                                    "between nodes (docs/planner.md)"));
    }
  });
  int calibrate = 0;
  if (runtime.rank() == 0) {
    calibrate = planner->needs_calibration() &&
                !std::filesystem::exists(planner->calibration_path(ranks));
  }
  MPI_Bcast(&calibrate, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (calibrate) {
    if (runtime.rank() == 0) {
      std::fprintf(stderr, "kolos: parallel.auto: calibrating this machine for %lld ranks (once: %s)\n",
                   (long long)ranks, planner->calibration_path(ranks).c_str());
    }
    calibrate_machine(runtime, *planner, path, overrides, config);
  }
  // The finalists tried for a few steps, the fastest measured kept (tune.h).
  const Tuned tuned = plan_and_tune(runtime, *planner, config, path, overrides);
  std::string chosen;
  agreed(world, [&] {
    if (runtime.rank() != 0) return;  // rank 0 reports the pick and writes the header
    const PlanReport& report = tuned.report;
    if (!tuned.trials.empty()) std::fputs(format_trials(tuned, "parallel.auto").c_str(), stderr);
    const PlannedRun& best = tuned.chosen;
    for (const auto& o : best.overrides) chosen += o + "\n";
    std::string sets;
    for (const auto& o : best.overrides) sets += " --set " + o;
    std::fprintf(stderr,
                 "kolos: parallel.auto: %s | predicted %.3f s/step, %s per rank | %zu plan(s) "
                 "kept of %s\nkolos: parallel.auto: the run is%s\n",
                 best.describe.c_str(), best.step_s,
                 detail::format_bytes(best.memory_bytes).c_str(), report.plans.size(),
                 report.machine.c_str(), sets.c_str());
    std::ostringstream h;
    h.precision(9);
    h << "{\"plan\":{\"describe\":" << json_quote(best.describe)
      << ",\"predicted_step_s\":" << best.step_s << ",\"memory_bytes\":" << best.memory_bytes
      << ",\"bytes_per_step\":" << best.bytes_per_step
      << ",\"machine\":" << json_quote(report.machine) << ",\"overrides\":[";
    for (size_t i = 0; i < best.overrides.size(); ++i) {
      h << (i ? "," : "") << json_quote(best.overrides[i]);
    }
    h << "]";
    if (!tuned.trials.empty()) h << ",\"tuning\":" << trials_json(tuned);
    h << "}}";
    *header = h.str();
  });
  const std::vector<std::string> plan = split_lines(broadcast_string(chosen));
  overrides.insert(overrides.end(), plan.begin(), plan.end());
  RunConfig resolved;
  agreed(world, [&] { resolved = load_run_config(path, overrides); });
  return resolved;
}

int train(const std::vector<std::string>& args, int argc, char** argv) {
  po::options_description options("options");
  std::vector<std::string> overrides;
  std::string config_path;
  std::string resume, resume_dir;
  options.add_options()("config", po::value(&config_path)->required(), "the run's TOML file")(
      "set", po::value(&overrides)->composing(), "override a key: --set train.steps=100")(
      "resume", po::value(&resume)->implicit_value(""),
      "resume from a checkpoint: --resume (the latest in [checkpoint] dir; none yet: start "
      "afresh) or --resume DIR")("resume-dir", po::value(&resume_dir), "");
  po::positional_options_description positional;
  positional.add("config", 1).add("resume-dir", 1);  // `CONFIG --resume DIR`
  Parsed parsed =
      parse("train", args, options, positional, "CONFIG [--set key=value ...] [--resume [DIR]]");
  if (parsed.help) return 0;
  const bool resuming = parsed.vm.count("resume") > 0;
  if (!resume_dir.empty() && !resuming) {
    throw UsageError("kolos train: unexpected argument `" + resume_dir +
                     "` (see `kolos train --help`)");
  }
  if (resume.empty()) resume = resume_dir;

  // Before anything slow: during set-up SIGTERM/SIGINT end the process at
  // once with a message and SIGUSR1 (Slurm's warning, whose default action
  // would kill) waits for the first step boundary; then all three stop the
  // run at a step boundary (signals.h).
  install_stop_handlers();
  Runtime runtime(&argc, &argv);
  return run_guarded(runtime, [&] {
    modules::register_builtin_models();
    RunConfig config;
    agreed(*runtime.world(), [&] { config = load_run_config(config_path, overrides); });
    std::string plan_header;
    if (config.parallel.auto_plan) {
      config = resolve_auto_plan(runtime, config_path, overrides, config, &plan_header);
    }
    const double runtime_bytes = resident_bytes();  // before the model exists
    Engine engine(config, runtime.world(), [](const RunConfig& c) { return data::make_source(c); });
    engine.set_metrics_header(plan_header);
    report_locality(runtime, engine.mesh().layout().shape());
    if (runtime.rank() == 0) {
      std::fprintf(stderr, "kolos: %s\n", engine.describe().c_str());
      // The estimate the engine checked (it refuses a run that exceeds the
      // budget); the summary's peak RSS is the measured counterpart.
      const MemoryEstimate memory = estimate_memory(config, runtime.size(), runtime_bytes);
      std::fprintf(stderr, "kolos: memory estimate %s per rank (%.0f bytes; largest: %s %s)\n",
                   detail::format_bytes(memory.peak()).c_str(), memory.peak(),
                   memory.largest().name.c_str(),
                   detail::format_bytes(memory.largest().bytes).c_str());
    }
    // Checkpoints: every `every` steps, at the end, and before a stop.
    const CheckpointConfig& cc = engine.config().checkpoint;
    std::unique_ptr<checkpoint::Checkpointer> ckpt;
    if (!cc.dir.empty() || resuming) {
      ckpt = std::make_unique<checkpoint::Checkpointer>(
          runtime.world(), checkpoint::Options{cc.dir, cc.keep_last, cc.async});
    }
    if (resuming) {
      if (resume.empty() && cc.dir.empty()) {
        throw UsageError("kolos train: --resume without DIR needs [checkpoint] dir in the config");
      }
      if (resume.empty() && checkpoint::latest(cc.dir).empty()) {
        if (runtime.rank() == 0) {
          std::fprintf(stderr, "kolos: no checkpoint in %s yet; starting from step 0\n",
                       cc.dir.c_str());
        }
      } else {
        TrainingState state = engine.state();
        const std::string dir = ckpt->load(resume.empty() ? cc.dir : resume, state);
        engine.load_state(state);
        if (runtime.rank() == 0) {
          std::fprintf(stderr, "kolos: resumed from %s at step %lld\n", dir.c_str(),
                       (long long)engine.steps_done());
        }
      }
    }
    const bool saving = !cc.dir.empty();
    TrainSummary summary = engine.train([&](const StepMetrics& m) {
      if (saving && cc.every > 0 && m.step % cc.every == 0) ckpt->save(engine.state());
    });
    if (saving && ckpt->last_saved_step() != engine.steps_done()) ckpt->save(engine.state());
    if (ckpt) ckpt->wait();
    if (runtime.rank() == 0) std::fprintf(stderr, "%s\n", format_summary(summary, engine).c_str());
    if (summary.stopped) {
      if (runtime.rank() == 0) {
        std::fprintf(stderr, "kolos: stopped on request after step %lld of %lld\n",
                     (long long)engine.steps_done(), (long long)engine.config().train.steps);
      }
      return kExitStopped;
    }
    return 0;
  });
}

int run(const std::vector<std::string>& args) {
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

int check(const std::vector<std::string>& args) {
  po::options_description options("options");
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t ranks = 0;
  int64_t per_node = 0;
  bool effective = false;
  options.add_options()("config", po::value(&config_path)->required(), "the run's TOML file")(
      "effective", po::bool_switch(&effective),
      "also print the effective configuration (every key, defaults included) as TOML")(
      "np,n", po::value(&ranks), "ranks to check for (default: the fewest the config's mesh fits)")(
      "per-node", po::value(&per_node),
      "ranks sharing this machine's memory (default 1: the config may be meant for other "
      "machines)")(
      "set", po::value(&overrides)->composing(), "override a key: --set train.steps=100");
  po::positional_options_description positional;
  positional.add("config", 1);
  Parsed parsed = parse("check", args, options, positional,
                        "CONFIG [-n N] [--per-node K] [--set key=value ...] [--effective]");
  if (parsed.help) return 0;
  const RunConfig config = load_run_config(config_path, overrides);
  if (ranks <= 0) {
    ranks = fewest_ranks(config);
  }
  const RunPlan plan = check_run(config, ranks);
  const MemoryEstimate memory = estimate_memory(config, ranks, resident_bytes());
  // A config may be meant for other machines: by default one rank on this
  // one must fit (--per-node says how many share it).
  const MemoryBudget budget = memory_budget(config, per_node > 0 ? std::min(per_node, ranks) : 1);
  check_memory_fits(config, memory, budget, ranks);
  std::cout << "kolos: " << config_path << ": ok for " << ranks << (ranks == 1 ? " rank" : " ranks")
            << ": mesh " << MeshLayout(plan.shape).describe() << " | layers " << plan.roles.layers
            << ", pipeline "
            << plan.roles.pipeline << ", gradients " << plan.roles.gradients
            << (plan.roles.sequence.empty() ? "" : ", sequence " + plan.roles.sequence)
            << (plan.roles.memory.empty() ? "" : ", memory " + plan.roles.memory)
            << " | batch " << config.train.global_batch << " = " << config.train.micro_batch
            << " x " << plan.accumulation << " accum x " << plan.shape.dp << " dp"
            << (plan.shape.of(expert_axis()) > 1
                    ? " x " + std::to_string(plan.shape.of(expert_axis())) + " ep"
                    : std::string())
            << " | memory about "
            << detail::format_bytes(memory.peak()) << " per rank of "
            << detail::format_bytes(budget.bytes) << "\n";
  if (config.parallel.auto_plan) {
    std::cout << "kolos: parallel.auto = true: that is the config's own layout; a run uses the "
                 "planner's choice (`kolos plan "
              << config_path << " -n " << ranks << "` shows it)\n";
  }
  if (effective) std::cout << "\n" << to_toml(config);
  return 0;
}

// kolos plan --memory: the estimate check_memory_fits uses, as a table.
int plan_memory(const std::string& config_path, const std::vector<std::string>& overrides,
                int64_t ranks, int64_t per_node, bool json) {
  const RunConfig config = load_run_config(config_path, overrides);
  check_run(config, ranks);
  // What this process holds once LibTorch and the plugins are loaded stands
  // for a rank's runtime; MPI adds a little more in a real rank.
  const MemoryEstimate estimate = estimate_memory(config, ranks, resident_bytes());
  const MemoryBudget budget =
      memory_budget(config, per_node > 0 ? std::min(per_node, ranks) : ranks);
  if (json) {
    std::cout.precision(17);
    std::cout << "{\"ranks\":" << ranks << ",\"peak_bytes\":" << estimate.peak()
              << ",\"training_peak_bytes\":" << estimate.training_peak()
              << ",\"build_peak_bytes\":" << estimate.build_peak
              << ",\"budget_bytes\":" << budget.bytes << ",\"terms\":{";
    for (size_t i = 0; i < estimate.terms.size(); ++i) {
      std::cout << (i ? "," : "") << "\"" << estimate.terms[i].name
                << "\":" << estimate.terms[i].bytes;
    }
    std::cout << "}}\n";
  } else {
    std::cout << "kolos: " << config_path << " on " << ranks
              << (ranks == 1 ? " rank" : " ranks") << ": " << format_memory_table(estimate, budget);
  }
  return estimate.peak() <= budget.bytes ? 0 : 1;
}

// Starts `kolos calibrate --worker` on `ranks` local ranks through mpirun
// and waits for it.
int launch_calibration(const std::string& config_path, const std::vector<std::string>& overrides,
                       int64_t ranks, const std::string& mpirun) {
  LaunchOptions launch;
  launch.ranks = static_cast<int>(ranks);
  launch.config = config_path;
  launch.overrides = overrides;
  launch.mpirun = mpirun;
  launch.command = "calibrate";
  launch.extra = {"--worker"};
  return spawn_mpirun(launch);
}

// kolos plan CONFIG -n N: the planner role's best plans for N ranks (the
// sizes and modes the config sets stay fixed), or with --predict the
// prediction for the config as it stands; --memory: the memory table;
// --tune K: the finalists tried on N ranks (tune.h; --worker: one of them).
int plan_command(const std::vector<std::string>& args, int argc, char** argv) {
  po::options_description options("options");
  std::string config_path, cluster, calibration, mpirun, tune;
  std::vector<std::string> overrides;
  int64_t ranks = 0;
  int64_t per_node = 0;
  int64_t top = 0;
  bool memory = false, json = false, predict = false, recalibrate = false, worker = false;
  options.add_options()("config", po::value(&config_path)->required(), "the run's TOML file")(
      "np,n", po::value(&ranks)->required(), "ranks of the run")(
      "cluster", po::value(&cluster),
      "plan for the machines a cluster file describes (sets planner.cluster)")(
      "calibration", po::value(&calibration),
      "use this calibration file instead of this host's cache (sets planner.calibration)")(
      "top", po::value(&top), "plans to print (sets planner.top; default 10)")(
      "tune", po::value(&tune),
      "try the best K plans (and every plan within the margin) for a few steps on N ranks and "
      "print the fastest measured (sets planner.tune)")("worker", po::bool_switch(&worker), "")(
      "predict", po::bool_switch(&predict),
      "no search: the prediction for the config's own layout")(
      "recalibrate", po::bool_switch(&recalibrate),
      "measure this machine again even when a calibration is cached")(
      "mpirun", po::value(&mpirun)->default_value(KOLOS_MPIEXEC), "mpirun for the calibration")(
      "memory", po::bool_switch(&memory), "print the per-rank memory estimate instead")(
      "per-node", po::value(&per_node),
      "--memory: ranks sharing this machine's memory (default: all of them)")(
      "json", po::bool_switch(&json), "as one JSON object")(
      "set", po::value(&overrides)->composing(), "override a key: --set train.micro_batch=2");
  po::positional_options_description positional;
  positional.add("config", 1);
  Parsed parsed =
      parse("plan", args, options, positional,
            "CONFIG -n N [--cluster FILE] [--top K] [--tune K] [--predict] [--json] [--set "
            "key=value ...]\n       kolos plan --memory CONFIG -n N [--per-node K] "
            "[--json]");
  if (parsed.help) return 0;
  if (ranks < 1) throw UsageError("kolos plan: -n must be at least 1");
  if (memory) return plan_memory(config_path, overrides, ranks, per_node, json);
  if (!cluster.empty()) overrides.push_back("planner.cluster=" + quote_toml(cluster));
  if (!calibration.empty()) overrides.push_back("planner.calibration=" + quote_toml(calibration));
  if (top > 0) overrides.push_back("planner.top=" + std::to_string(top));
  if (parsed.vm.count("tune")) {
    if (tune.empty() || tune.find_first_not_of("0123456789") != std::string::npos ||
        tune.size() > 3 || std::stoi(tune) < 1 || predict) {
      throw UsageError("kolos plan: --tune " + quote_toml(tune) +
                       (predict ? ": --predict has no plans to try"
                                : ": expected the number of finalists, a whole number >= 1 (e.g. "
                                  "--tune 3)"));
    }
    overrides.push_back("planner.tune=" + tune);
  }
  if (worker) return plan_tune_worker(argc, argv, config_path, overrides, json, make_planner);
  modules::register_builtin_models();
  const RunConfig config = load_run_config(config_path, overrides);
  check_model_name(config);
  std::shared_ptr<Planner> planner = make_planner(config);
  planner->check(config);
  if (planner->needs_calibration() &&
      (recalibrate || !std::filesystem::exists(planner->calibration_path(ranks)))) {
    std::cerr << "kolos plan: calibrating this machine for " << ranks
              << " ranks (once: " << planner->calibration_path(ranks) << ")\n";
    const int rc = launch_calibration(config_path, overrides, ranks, mpirun);
    if (rc != 0) {
      throw Error("kolos plan: the calibration failed (exit " + std::to_string(rc) +
                  "); its message is above");
    }
  }
  if (parsed.vm.count("tune")) {  // the finalists run on N ranks
    if (!planner->needs_calibration()) {
      throw UsageError("kolos plan: --tune runs the finalists on this machine; a cluster file's "
                       "plans are for other machines (parallel.auto tries them in a job there)");
    }
    LaunchOptions launch;
    launch.ranks = static_cast<int>(ranks), launch.config = config_path, launch.mpirun = mpirun;
    launch.overrides = overrides, launch.command = "plan";
    launch.extra = {"-n", std::to_string(ranks), "--worker", "--tune", tune};
    if (json) launch.extra.push_back("--json");
    return spawn_mpirun(launch);
  }
  const PlanReport report =
      predict ? planner->predict(config, ranks) : planner->plan(config, ranks);
  if (json) {
    std::cout << report.json << "\n";
  } else {
    std::cout << "kolos: " << config_path << " on " << ranks << (ranks == 1 ? " rank" : " ranks")
              << (predict ? " as configured" : "") << ", planned for " << report.text;
    if (!predict && !report.plans.empty()) {
      std::cout << "\nthe best as a run:";
      for (const auto& o : report.plans.front().overrides) std::cout << " --set " << o;
      std::cout << "\n";
    }
  }
  return 0;
}

// kolos calibrate CONFIG -n N: measures this machine with N ranks at once
// (compute rates at the config's model shape, collectives of every group
// size) into the planner's cache. --worker: one rank of that measurement.
int calibrate_command(const std::vector<std::string>& args, int argc, char** argv) {
  po::options_description options("options");
  std::string config_path, mpirun;
  std::vector<std::string> overrides;
  int64_t ranks = 0;
  bool worker = false;
  options.add_options()("config", po::value(&config_path)->required(), "the run's TOML file")(
      "np,n", po::value(&ranks), "ranks to measure with (those of the runs to plan)")(
      "mpirun", po::value(&mpirun)->default_value(KOLOS_MPIEXEC), "mpirun to use")(
      "worker", po::bool_switch(&worker), "")("set", po::value(&overrides)->composing(),
                                              "override a key");
  po::positional_options_description positional;
  positional.add("config", 1);
  Parsed parsed =
      parse("calibrate", args, options, positional, "CONFIG -n N [--set key=value ...]");
  if (parsed.help) return 0;
  if (!worker) {
    if (ranks < 1) throw UsageError("kolos calibrate: -n N (at least 1) is required");
    const RunConfig config = load_run_config(config_path, overrides);
    std::shared_ptr<Planner> planner = make_planner(config);
    if (!planner->needs_calibration()) {
      throw UsageError("kolos calibrate: [planner] cluster is set: that plan uses the cluster "
                       "file's rates, not this machine's; remove it to calibrate");
    }
    std::cerr << "kolos calibrate: " << ranks << " ranks -> " << planner->calibration_path(ranks)
              << "\n";
    return launch_calibration(config_path, overrides, ranks, mpirun);
  }
  install_stop_handlers();
  Runtime runtime(&argc, &argv);
  return run_guarded(runtime, [&] {
    modules::register_builtin_models();
    RunConfig config;
    std::shared_ptr<Planner> planner;
    agreed(*runtime.world(), [&] {
      config = load_run_config(config_path, overrides);
      planner = make_planner(config);
    });
    const auto start = std::chrono::steady_clock::now();
    calibrate_machine(runtime, *planner, config_path, overrides, config);
    const std::string path = planner->calibration_path(runtime.size());
    if (runtime.rank() == 0) {
      std::fprintf(stderr, "kolos calibrate: %d ranks measured in %.1f s -> %s\n", runtime.size(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                   path.c_str());
    }
    return 0;
  });
}

int plugins(const std::vector<std::string>& args) {
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

int data_command(const std::vector<std::string>& args) {
  constexpr const char* kSynopsis =
      "FILE... -o OUT [--tokenizer PATH] | --images DIR -o OUT.h5 | --images X.npy --labels "
      "Y.npy -o OUT.h5";
  if (args.empty() || args[0] != "prepare") {
    if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
      std::cout << "usage: kolos data prepare " << kSynopsis << "\n";
      return 0;
    }
    throw UsageError("kolos data: expected `kolos data prepare FILE... -o OUT` or `kolos data "
                     "prepare --images DIR -o OUT.h5`");
  }
  po::options_description options("options");
  std::vector<std::string> inputs;
  std::string output, tokenizer_path, images_path, labels_path;
  options.add_options()("input", po::value(&inputs), "text files to tokenise")(
      "output,o", po::value(&output)->required(),
      "file to write: a token file (uint16, vocab 256; with --tokenizer uint16 or uint32), or "
      "with --images an HDF5 images file for [data] kind = \"images\"")(
      "tokenizer", po::value(&tokenizer_path),
      "tokenizer.json, tokenizer.model or a directory holding one: each FILE is one document, "
      "eos between documents (docs/data.md)")(
      "images", po::value(&images_path),
      "a folder with one subfolder of PNG/JPEG images per class (sorted names are labels "
      "0..K-1), or a .npy of uint8 images (N x H x W x C or N x H x W) with --labels")(
      "labels", po::value(&labels_path),
      "with --images X.npy: a .npy of N int64, int32 or uint8 labels");
  po::positional_options_description positional;
  positional.add("input", -1);
  Parsed parsed = parse("data prepare", {args.begin() + 1, args.end()}, options, positional,
                        kSynopsis);
  if (parsed.help) return 0;
  if (!images_path.empty()) {
    if (!inputs.empty() || !tokenizer_path.empty()) {
      throw UsageError("kolos data prepare: --images makes an images file; it takes no text "
                       "FILEs and no --tokenizer");
    }
    // Without --labels: a folder (prepare_images_from_folder says so when it is not one).
    if (!labels_path.empty() && std::filesystem::is_directory(images_path)) {
      throw UsageError("kolos data prepare: --labels goes with --images X.npy; a folder's labels "
                       "are its class subfolders");
    }
    const data::ImagesPrepared r =
        labels_path.empty() ? data::prepare_images_from_folder(images_path, output)
                            : data::prepare_images_from_npy(images_path, labels_path, output);
    std::cout << "kolos: wrote " << r.images << " images of " << r.height << "x" << r.width << "x"
              << r.channels << " and " << r.classes << " classes";
    if (!r.class_names.empty()) {
      std::cout << " (";
      for (size_t i = 0; i < r.class_names.size(); ++i) {
        std::cout << (i ? ", " : "") << i << " = " << r.class_names[i];
      }
      std::cout << ")";
    }
    std::cout << " to " << output << ": set model.image_size = " << r.height
              << ", model.channels = " << r.channels << ", model.classes >= " << r.classes
              << "\n";
    return 0;
  }
  if (!labels_path.empty()) {
    throw UsageError("kolos data prepare: --labels goes with --images X.npy");
  }
  if (inputs.empty()) {
    throw UsageError("kolos data prepare: no input files; give text FILEs to tokenise or "
                     "--images DIR (see `kolos data prepare --help`)");
  }
  if (!tokenizer_path.empty()) {
    const auto tok = tokenizer::open_tokenizer(tokenizer_path);
    const auto r = tokenizer::prepare_token_file(inputs, output, *tok);
    const double s = std::max(r.encode_seconds, 1e-9);
    auto fixed = [](double value, int digits) {
      std::ostringstream out;
      out.setf(std::ios::fixed);
      out.precision(digits);
      out << value;
      return out.str();
    };
    std::cout << "kolos: wrote " << r.tokens << " tokens (" << r.dtype << ", vocab " << r.vocab
              << ") from " << r.documents << " documents to " << output << ": set data.dtype = \""
              << r.dtype << "\" and model.vocab >= " << r.vocab << "\n"
              << "kolos: " << tok->description() << " " << tok->path() << ": " << r.input_bytes
              << " bytes in " << fixed(r.encode_seconds, 3) << " s, "
              << static_cast<int64_t>(r.tokens / s) << " tokens/s, "
              << fixed(r.input_bytes / s / 1e6, 2) << " MB/s\n";
    return 0;
  }
  int64_t tokens = data::prepare_byte_tokens(inputs, output);
  std::cout << "kolos: wrote " << tokens << " tokens (uint16, vocab 256) to " << output << "\n";
  return 0;
}

int topo(const std::vector<std::string>& args) {
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

int version(const std::vector<std::string>& args) {
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
  if (command == "--version") return version({});
  if (command == "train") return train(args, argc, argv);
  if (command == "run") return run(args);
  if (command == "check") return check(args);
  if (command == "plan") return plan_command(args, argc, argv);
  if (command == "calibrate") return calibrate_command(args, argc, argv);
  if (command == "plugins") return plugins(args);
  if (command == "data") return data_command(args);
  if (command == "ckpt") return ckpt_command(args);
  if (command == "generate") return generate_command(args, argc, argv);
  if (command == "serve") return serve_command(args, argc, argv);
  if (command == "sample") return sample_command(args);
  if (command == "slurm") return slurm_command(args);
  if (command == "topo") return topo(args);
  if (command == "version") return version(args);
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
