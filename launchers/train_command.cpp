// `kolos train`: one rank's part of a job. Loads the config (with
// parallel.auto, the planner's layout: auto_plan.h), builds the engine,
// resumes from and writes checkpoints, trains, and prints the summary; the
// locality of the mesh's groups is reported on rank 0.
#include "train_command.h"

#include <boost/program_options.hpp>
#include <cstdio>
#include <memory>
#include <sstream>

#include "auto_plan.h"
#include "command_options.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/format.h"
#include "kolos/core/malloc_tuning.h"
#include "kolos/core/memory_estimate.h"
#include "kolos/core/run_config.h"
#include "kolos/core/runtime.h"
#include "kolos/core/signals.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"
#include "kolos/topology/locality.h"

namespace po = boost::program_options;

namespace kolos::cli {
namespace {

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

}  // namespace

int train_command(const std::vector<std::string>& args, int argc, char** argv) {
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
  // A rank that trains runs on kolos's heap (malloc_tuning.h): this may
  // restart the process once, before MPI or anything slow starts in it.
  reexec_with_malloc_tuning(argv);
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
      // The runtime, measured here before the model existed, is printed
      // so that the estimate's model part can be held against the
      // measured peak less the same runtime (tests/e2e/memory).
      // The heap it was estimated for is the one this process runs with
      // (malloc_tuning.h).
      const MallocSetup heap = training_malloc();
      std::fprintf(stderr,
                   "kolos: memory estimate %s per rank (%.0f bytes, of which runtime %.0f; "
                   "largest: %s %s; heap: %s)\n",
                   detail::format_bytes(memory.peak()).c_str(), memory.peak(), runtime_bytes,
                   memory.largest().name.c_str(),
                   detail::format_bytes(memory.largest().bytes).c_str(),
                   heap.tuned            ? "tuned"
                   : heap.reason.empty() ? "glibc's defaults"
                                         : ("glibc's defaults, " + heap.reason).c_str());
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

}  // namespace kolos::cli
