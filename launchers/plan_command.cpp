// `kolos plan` and `kolos calibrate`: the planner role's plans for a config
// on N ranks, its memory table, its finalists tried on this machine
// (tune.h), and the calibration they need, measured by N local ranks that
// mpirun starts (`--worker`; the measurement itself: auto_plan.h).
#include "plan_command.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "auto_plan.h"
#include "check_command.h"
#include "command_options.h"
#include "kolos/config.h"
#include "kolos/core/config_located.h"
#include "kolos/core/error.h"
#include "kolos/core/malloc_tuning.h"
#include "kolos/core/memory_estimate.h"
#include "kolos/core/planner.h"
#include "kolos/core/run_config.h"
#include "kolos/core/runtime.h"
#include "kolos/core/settings.h"
#include "kolos/core/signals.h"
#include "kolos/modules/gpt.h"
#include "launch.h"
#include "tune.h"

namespace po = boost::program_options;

namespace kolos::cli {
namespace {

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
              << ",\"budget_bytes\":" << budget.bytes
              << ",\"heap_tuned\":" << (training_malloc().tuned ? "true" : "false")
              << ",\"terms\":{";
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

}  // namespace

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
  return planner_worker(
      argc, argv, config_path, overrides, make_planner,
      [&](const Runtime& runtime, Planner& planner, const RunConfig& config) {
        const auto start = std::chrono::steady_clock::now();
        calibrate_machine(runtime, planner, config_path, overrides, config);
        const std::string path = planner.calibration_path(runtime.size());
        if (runtime.rank() == 0) {
          std::fprintf(
              stderr, "kolos calibrate: %d ranks measured in %.1f s -> %s\n", runtime.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              path.c_str());
        }
        return 0;
      });
}

}  // namespace kolos::cli
