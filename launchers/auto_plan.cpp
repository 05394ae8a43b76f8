// The planner role inside a job (launchers/auto_plan.h): the planner plugin
// a config chooses, this machine's calibration (also `kolos calibrate`'s
// worker) and parallel.auto's choice of layout, tried and measured through
// tune.h, before `kolos train` builds its engine.
#include "auto_plan.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <utility>

#include "kolos/core/config_located.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/format.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/modules/data.h"
#include "tune.h"

namespace kolos::cli {
namespace {

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

}  // namespace

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

void calibrate_machine(const Runtime& runtime, Planner& planner, const std::string& path,
                       std::vector<std::string> overrides, const RunConfig& config) {
  planner.calibrate(runtime.world(), config);
  for (const char* o : {"parallel.auto=false", "parallel.data=0", "parallel.tensor.size=1",
                        "parallel.pipeline.size=1", "parallel.sequence.size=1",
                        "parallel.zero.stage=0", "train.recompute=\"none\"", "train.steps=6",
                        "log.metrics=\"\"", "log.progress=\"off\"", "checkpoint.dir=\"\""}) {
    overrides.push_back(o);
  }
  // Each reference runs twice, all of them in turn before the second
  // pass, and keeps the faster of its two medians (as the block
  // measurements do): another tenant's burst only slows a run, and a slow
  // spell shorter than the time between a reference's two runs slows one
  // of them, not both. One slow run would otherwise set the step factor
  // that every later prediction on this host carries. Without a reference
  // run (the config fixes a mode that needs a size the reference does not
  // have, or the model does not fit the layout) its figure is not measured.
  struct Reference {
    std::string name;
    std::vector<std::string> layout;
    RunConfig run;
    double seconds = 0;  // the fastest pass's median; 0 until one measured
    bool skipped = false;
  };
  std::vector<Reference> refs = {{"data-parallel", {}}};
  // The same at a quarter of the micro-batch (four times the micro-batches;
  // a half or 1 where a quarter does not divide it): the pair sets what a
  // block costs per micro-batch whatever its size. The difference of two
  // noisy steps: at one more micro-batch it would be within the noise.
  if (const int64_t mb = config.train.micro_batch; mb >= 2) {
    const int64_t small = mb % 4 == 0 ? mb / 4 : mb % 2 == 0 ? mb / 2 : 1;
    refs.push_back(
        {"data-parallel, smaller micro-batch", {"train.micro_batch=" + std::to_string(small)}});
  }
  const std::string rest = "parallel.data=" + std::to_string(runtime.size() / 4);
  if (runtime.size() % 4 == 0) {
    refs.push_back(
        {"tensor 1d",
         {rest, "parallel.tensor.size=4", "parallel.tensor.mode=\"1d\"", "train.micro_batch=2"}});
  }
  // Tensor 1d in pairs, each pair's collectives waiting while the other
  // pairs compute on the same cores, under Megatron's sequence split: the
  // most collectives a tensor 1d layout issues, so that the step shows what
  // each one waits, not its noise. Recorded after tensor 1d over 4, it sets
  // the group rows of 2.
  if (runtime.size() % 2 == 0) {
    refs.push_back({"tensor 1d in pairs",
                    {"parallel.data=" + std::to_string(runtime.size() / 2),
                     "parallel.tensor.size=2", "parallel.tensor.mode=\"1d\"",
                     "parallel.sequence.mode=\"megatron\"", "train.micro_batch=2"}});
  }
  if (runtime.size() % 4 == 0) {
    refs.push_back(
        {"tensor 2d",
         {rest, "parallel.tensor.size=4", "parallel.tensor.mode=\"2d\"", "train.micro_batch=2"}});
    refs.push_back({"ring attention",
                    {rest, "parallel.sequence.size=4", "parallel.sequence.mode=\"ring\"",
                     "train.micro_batch=2"}});
  }
  // Every rank reads the same config and agrees on the engine's refusals,
  // so every rank skips alike.
  const auto skip = [&](Reference& ref, const std::string& why) {
    ref.skipped = true;
    if (runtime.rank() == 0) {
      std::fprintf(stderr, "kolos: calibration: no %s reference run (%s)\n", ref.name.c_str(),
                   why.substr(0, why.find('\n')).c_str());
    }
  };
  for (Reference& ref : refs) {
    std::vector<std::string> o = overrides;
    o.insert(o.end(), ref.layout.begin(), ref.layout.end());
    try {
      ref.run = load_run_config(path, o);
    } catch (const Error& e) {
      skip(ref, e.what());
    }
  }
  constexpr int kPasses = 2;
  for (int pass = 0; pass < kPasses; ++pass) {
    for (Reference& ref : refs) {
      if (ref.skipped) continue;
      std::vector<double> times;
      try {
        Engine engine(ref.run, runtime.world(),
                      [](const RunConfig& c) { return data::make_source(c); });
        engine.train([&](const StepMetrics& m) { times.push_back(m.step_time_s); });
      } catch (const AgreedError& e) {
        skip(ref, e.what());
        continue;
      }
      // The steps after the first two (allocation, first touches).
      const double median = steady_median(std::move(times), 2);
      if (median > 0 && (ref.seconds == 0 || median < ref.seconds)) ref.seconds = median;
    }
  }
  if (runtime.rank() != 0) return;
  // The data-parallel reference is recorded again after the tensor 1d ones
  // (over 4, then in pairs): its few collectives now wait the group
  // figures, and the step factor and the fixed cost per micro-batch follow.
  size_t last_group = refs.size();
  for (size_t i = 0; i < refs.size(); ++i) {
    if (refs[i].name == "tensor 1d" || refs[i].name == "tensor 1d in pairs") last_group = i;
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < refs.size(); ++i) {
    order.push_back(i);
    if (i == last_group) order.push_back(0);
  }
  for (const size_t i : order) {
    const Reference& ref = refs[i];
    if (!ref.skipped && ref.seconds > 0)
      planner.record_reference(ref.run, runtime.size(), ref.seconds);
  }
}

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
  const std::vector<std::string> plan = split_lines(broadcast_text(chosen));
  overrides.insert(overrides.end(), plan.begin(), plan.end());
  RunConfig resolved;
  agreed(world, [&] { resolved = load_run_config(path, overrides); });
  return resolved;
}

}  // namespace kolos::cli
