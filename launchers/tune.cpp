// The finalists' trial runs (tune.h).
#include "tune.h"

#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/malloc_tuning.h"
#include "kolos/core/run_config.h"
#include "kolos/core/signals.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos::cli {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double world_max(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

// The finalists and the tune settings as lines of tab-separated fields (the
// overrides joined by \x1f): what rank 0 broadcasts.
std::string encode(const PlanReport& report) {
  std::ostringstream out;
  out.precision(17);
  out << report.tune.steps << '\t' << report.tune.warmup << '\t' << report.tune.budget_s << '\n';
  for (const size_t i : report.finalists) {
    const PlannedRun& p = report.plans[i];
    std::string overrides;
    for (const auto& o : p.overrides) overrides += (overrides.empty() ? "" : "\x1f") + o;
    out << p.describe << '\t' << p.step_s << '\t' << p.uncertainty << '\t' << p.model_step_s << '\t'
        << p.family << '\t' << p.memory_bytes << '\t' << p.bytes_per_step << '\t' << overrides
        << '\n';
  }
  return out.str();
}

void decode(const std::string& text, TuneSettings* tune, std::vector<PlannedRun>* plans) {
  const std::vector<std::string> lines = split(text, '\n');
  if (lines.empty()) return;
  const std::vector<std::string> head = split(lines[0], '\t');
  tune->steps = std::stoll(head.at(0));
  tune->warmup = std::stoll(head.at(1));
  tune->budget_s = std::stod(head.at(2));
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = split(lines[i], '\t');
    PlannedRun p;
    p.describe = f.at(0);
    p.step_s = std::stod(f.at(1));
    p.uncertainty = std::stod(f.at(2));
    p.model_step_s = std::stod(f.at(3));
    p.family = f.at(4);
    p.memory_bytes = std::stod(f.at(5));
    p.bytes_per_step = std::stod(f.at(6));
    p.overrides = split(f.size() > 7 ? f[7] : "", '\x1f');
    plans->push_back(std::move(p));
  }
}

// Fault injection, compiled only into the test copy of this library
// (libkolos_tune built with KOLOS_FAULT_INJECTION into lib/faults of the
// build tree, never installed; tests/e2e/planner preloads it): the
// installed library reads no test switch.
#ifdef KOLOS_FAULT_INJECTION
// KOLOS_TEST_TUNE_STEP_S = "PATTERN=SECONDS;...": the injected time of the
// first finalist whose description contains PATTERN, or 0.
double injected_seconds(const std::string& describe) {
  const char* env = std::getenv("KOLOS_TEST_TUNE_STEP_S");
  if (env == nullptr) return 0;
  for (const std::string& item : split(env, ';')) {
    const auto eq = item.rfind('=');
    if (eq == std::string::npos || eq == 0) continue;
    if (describe.find(item.substr(0, eq)) != std::string::npos)
      return std::stod(item.substr(eq + 1));
  }
  return 0;
}

// KOLOS_TEST_TUNE_WALL_S = SECONDS: every finalist run takes that long on
// the tuning's clock (which then counts only these), so that a test sets
// where the time bound falls; 0 when unset.
double injected_wall() {
  const char* env = std::getenv("KOLOS_TEST_TUNE_WALL_S");
  return env != nullptr && *env ? std::stod(env) : 0.0;
}

// KOLOS_TEST_TUNE_FAIL = PATTERN: the set-up of a matching finalist fails
// on the last rank only, which every rank must agree on.
void maybe_fail_setup(const Runtime& runtime, const std::string& describe) {
  const char* fail = std::getenv("KOLOS_TEST_TUNE_FAIL");
  if (fail != nullptr && *fail && describe.find(fail) != std::string::npos &&
      runtime.rank() == runtime.size() - 1) {
    throw ConfigError("injected set-up failure on rank " + std::to_string(runtime.rank()) +
                      " (KOLOS_TEST_TUNE_FAIL)");
  }
}
#else
double injected_seconds(const std::string&) { return 0; }
double injected_wall() { return 0; }
void maybe_fail_setup(const Runtime&, const std::string&) {}
#endif

std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  if (line.size() > 300) line = line.substr(0, 297) + "...";
  return line;
}

// The finalists measured within this share of the fastest are measured a
// second time (plan_and_tune).
constexpr double kCloseShare = 0.10;
// The share of the time bound the first pass may take while finalists are
// left: the rest is kept for the second pass.
constexpr double kFirstPassShare = 0.75;

// Rank 0's estimate of the next finalist's wall time: as long as the
// earlier ones took on average (set-up and steps, the clock's own time, not
// a prediction: a family the model misjudges does not skew it).
double expected_seconds(const std::vector<double>& walls) {
  double sum = 0;
  for (const double w : walls) sum += w;
  return walls.empty() ? 0.0 : sum / static_cast<double>(walls.size());
}

}  // namespace

double steady_median(std::vector<double> times, size_t skip) {
  if (times.size() <= skip) return 0;
  times.erase(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(skip));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::string broadcast_text(std::string text) {
  long long size = static_cast<long long>(text.size());
  MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  text.resize(static_cast<size_t>(size));
  if (size > 0) MPI_Bcast(text.data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD);
  return text;
}

int planner_worker(int argc, char** argv, const std::string& path,
                   const std::vector<std::string>& overrides, const PlannerFactory& make_planner,
                   const PlannerBody& body) {
  // The calibration's and the finalists' steps are timed on the heap a
  // training run uses (malloc_tuning.h): this may restart the process once.
  reexec_with_malloc_tuning(argv);
  install_stop_handlers();
  Runtime runtime(&argc, &argv);
  return run_guarded(runtime, [&] {
    RunConfig config;
    std::shared_ptr<Planner> planner;
    modules::register_builtin_models();
    agreed(*runtime.world(), [&] {
      config = load_run_config(path, overrides);
      planner = make_planner(config);
    });
    return body(runtime, *planner, config);
  });
}

Tuned plan_and_tune(const Runtime& runtime, Planner& planner, const RunConfig& config,
                    const std::string& path, const std::vector<std::string>& overrides) {
  comm::ProcessGroup& world = *runtime.world();
  const bool root = runtime.rank() == 0;
  Tuned out;
  std::string finalists;
  agreed(world, [&] {
    if (!root) return;
    out.report = planner.plan(config, runtime.size());
    if (out.report.plans.empty()) throw Error("the planner offered no plan");
    if (out.report.finalists.size() >= 2) finalists = encode(out.report);
  });
  TuneSettings tune;
  std::vector<PlannedRun> plans;
  decode(broadcast_text(finalists), &tune, &plans);

  const auto start = Clock::now();
  std::vector<double> walls;  // rank 0's: each finalist run's wall time
  const double wall_hook = injected_wall();
  const auto elapsed = [&] {
    double sum = 0;
    for (const double w : walls) sum += w;
    return wall_hook > 0 ? sum : since(start);
  };
  // Whether `bound` seconds leave room for one more finalist run: rank 0
  // decides, every rank follows.
  const auto room = [&](double bound) {
    int go = root && elapsed() + expected_seconds(walls) <= bound;
    MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return go != 0;
  };
  // One run of finalist `plan`: its median step after the warm-up, the
  // slowest rank's (every rank holds the same figure), or 0 with `skipped`
  // saying why.
  const auto measure = [&](const PlannedRun& plan, std::string& skipped) {
    const auto t0 = Clock::now();
    std::vector<std::string> o = overrides;
    o.insert(o.end(), plan.overrides.begin(), plan.overrides.end());
    for (const std::string& fixed :
         {"train.steps=" + std::to_string(tune.steps), std::string("log.metrics=\"\""),
          std::string("log.progress=\"off\""), std::string("checkpoint.dir=\"\"")}) {
      o.push_back(fixed);
    }
    std::vector<double> times;
    try {
      RunConfig run;
      agreed(world, [&] {
        maybe_fail_setup(runtime, plan.describe);
        run = load_run_config(path, o);
      });
      Engine engine(run, runtime.world(), [](const RunConfig& c) { return data::make_source(c); });
      engine.train([&](const StepMetrics& m) { times.push_back(m.step_time_s); });
    } catch (const AgreedError& e) {
      skipped = "skipped: " + first_line(e.what());
    }
    malloc_trim(0);  // what the finalist's model held, back before the next one
    const double median = steady_median(std::move(times), static_cast<size_t>(tune.warmup));
    double measured = world_max(skipped.empty() ? median : 0.0);
    if (skipped.empty() && !(measured > 0)) {
      skipped = "skipped: it ended before a timed step (a stop request?)";
    }
    if (skipped.empty()) {
      if (const double s = injected_seconds(plan.describe); s > 0) measured = s;
    }
    walls.push_back(wall_hook > 0 ? wall_hook : since(t0));
    return skipped.empty() ? measured : 0.0;
  };

  // The first pass, best prediction first (always tried), within
  // kFirstPassShare of the bound; what it leaves is tried after the second
  // pass, within the whole bound.
  std::ostringstream bound_text;
  bound_text.precision(3);
  bound_text << "not tried: the tuning's time bound (" << tune.budget_s
             << " s, planner.tune_seconds)";
  const std::string not_tried = bound_text.str();
  const auto run_first = [&](TrialResult& trial) {
    trial.skipped.clear();
    trial.measured_s = measure(trial.plan, trial.skipped);
    trial.passes = trial.skipped.empty() ? 1 : 0;
  };
  for (size_t i = 0; i < plans.size(); ++i) {
    TrialResult trial;
    trial.plan = plans[i];
    if (i > 0 && !room(kFirstPassShare * tune.budget_s)) {
      trial.skipped = not_tried;
    } else {
      run_first(trial);
    }
    out.trials.push_back(trial);
  }
  // The second pass: when two or more finalists measured within
  // kCloseShare of the fastest, they run again, in the reverse order of
  // the first, and keep the faster of their two figures. One pass of a few
  // steps on a shared machine is noisy, and a finalist's place in the order
  // moves its figure (the ones before it leave the allocator and caches in
  // another state): a pick between close figures is made on two.
  double fastest = 0;
  for (const TrialResult& t : out.trials) {
    if (t.passes > 0 && (fastest == 0 || t.measured_s < fastest)) fastest = t.measured_s;
  }
  const auto near = [&](const TrialResult& t) {
    return t.passes > 0 && t.measured_s <= (1 + kCloseShare) * fastest;
  };
  const bool contest = std::count_if(out.trials.begin(), out.trials.end(), near) >= 2;
  for (size_t k = out.trials.size(); contest && k-- > 0;) {
    TrialResult& t = out.trials[k];
    if (!near(t)) continue;
    if (!room(tune.budget_s)) break;
    std::string skipped;
    const double again = measure(t.plan, skipped);
    if (skipped.empty()) {
      t.measured_s = std::min(t.measured_s, again);
      ++t.passes;
    }
  }
  for (TrialResult& t : out.trials) {
    if (t.passes > 0 || t.skipped != not_tried) continue;
    if (!room(tune.budget_s)) break;
    run_first(t);
  }
  out.seconds = world_max(root ? since(start) : 0.0);
  for (size_t i = 0; i < out.trials.size(); ++i) {
    const TrialResult& t = out.trials[i];
    if (!t.skipped.empty()) continue;
    if (out.pick < 0 || t.measured_s < out.trials[static_cast<size_t>(out.pick)].measured_s) {
      out.pick = static_cast<int64_t>(i);
    }
  }
  if (out.pick >= 0) {
    out.chosen = out.trials[static_cast<size_t>(out.pick)].plan;
  } else if (root) {
    out.chosen = out.report.plans.front();
  }
  // The feedback is worth having, not worth ending the run for: a file that
  // cannot be written is reported and the run goes on.
  if (root && out.pick >= 0) {
    try {
      out.recorded = planner.record_trials(runtime.size(), out.trials);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kolos: warning: the finalists' measurements were not recorded: %s\n",
                   first_line(e.what()).c_str());
    }
  }
  return out;
}

std::string format_trials(const Tuned& tuned, const std::string& prefix) {
  std::ostringstream out;
  char line[512];
  const TuneSettings& tune = tuned.report.tune;
  out << "kolos: " << prefix << ": " << tuned.trials.size() << " finalists, "
      << tuned.report.finalist_rule << "; each runs " << tune.steps << " steps, timed after "
      << tune.warmup << " (the median, the slowest rank's); those within "
      << std::lround(100 * kCloseShare)
      << "% of the fastest run again, in reverse order, keeping the faster figure:\n";
  std::snprintf(line, sizeof line, "kolos: %s:   %-2s %-58s %12s %6s %12s %9s %6s\n",
                prefix.c_str(), "#", "plan", "predicted s", "+-", "measured s", "meas/pred",
                "passes");
  out << line;
  for (size_t i = 0; i < tuned.trials.size(); ++i) {
    const TrialResult& t = tuned.trials[i];
    const bool pick = static_cast<int64_t>(i) == tuned.pick;
    if (t.skipped.empty()) {
      std::snprintf(line, sizeof line,
                    "kolos: %s: %s %-2zu %-58s %12.4f %5.1f%% %12.4f %9.3f %6d\n", prefix.c_str(),
                    pick ? "*" : " ", i + 1, t.plan.describe.c_str(), t.plan.step_s,
                    100 * t.plan.uncertainty, t.measured_s, t.measured_s / t.plan.step_s, t.passes);
    } else {
      std::snprintf(line, sizeof line, "kolos: %s:   %-2zu %-58s %12.4f %5.1f%% %s\n",
                    prefix.c_str(), i + 1, t.plan.describe.c_str(), t.plan.step_s,
                    100 * t.plan.uncertainty, t.skipped.c_str());
    }
    out << line;
  }
  if (tuned.pick >= 0) {
    const TrialResult& p = tuned.trials[static_cast<size_t>(tuned.pick)];
    std::snprintf(line, sizeof line,
                  "kolos: %s: picked #%lld, the fastest measured: %s (%.3f s/step measured, %.3f "
                  "predicted); tuning took %.1f s (bound %.3g s)\n",
                  prefix.c_str(), static_cast<long long>(tuned.pick + 1), p.plan.describe.c_str(),
                  p.measured_s, p.plan.step_s, tuned.seconds, tune.budget_s);
  } else {
    std::snprintf(line, sizeof line,
                  "kolos: %s: no finalist was measured; training the best prediction; tuning took "
                  "%.1f s\n",
                  prefix.c_str(), tuned.seconds);
  }
  out << line;
  if (!tuned.recorded.empty()) {
    out << "kolos: " << prefix << ": measured/predicted ratios recorded for later plans on this "
        << "host: " << tuned.recorded << "\n";
  }
  return out.str();
}

std::string trials_json(const Tuned& tuned) {
  const auto quote = [](const std::string& s) {
    std::string q = "\"";
    for (const char ch : s) {
      if (ch == '"' || ch == '\\') q += '\\';
      q += ch;
    }
    return q + "\"";
  };
  std::ostringstream out;
  out.precision(9);
  out << "{\"finalists\":[";
  for (size_t i = 0; i < tuned.trials.size(); ++i) {
    const TrialResult& t = tuned.trials[i];
    out << (i ? "," : "") << "{\"describe\":" << quote(t.plan.describe)
        << ",\"predicted_step_s\":" << t.plan.step_s << ",\"uncertainty\":" << t.plan.uncertainty
        << ",\"family\":" << quote(t.plan.family) << ",\"measured_step_s\":" << t.measured_s
        << ",\"passes\":" << t.passes << ",\"skipped\":" << quote(t.skipped) << ",\"overrides\":[";
    for (size_t k = 0; k < t.plan.overrides.size(); ++k)
      out << (k ? "," : "") << quote(t.plan.overrides[k]);
    out << "]}";
  }
  out << "],\"pick\":" << tuned.pick << ",\"seconds\":" << tuned.seconds
      << ",\"bound_s\":" << tuned.report.tune.budget_s << "}";
  return out.str();
}

int plan_tune_worker(int argc, char** argv, const std::string& config_path,
                     const std::vector<std::string>& overrides, bool json,
                     const PlannerFactory& make_planner) {
  return planner_worker(
      argc, argv, config_path, overrides, make_planner,
      [&](const Runtime& runtime, Planner& planner, const RunConfig& config) {
        const Tuned tuned = plan_and_tune(runtime, planner, config, config_path, overrides);
        if (runtime.rank() != 0) return 0;
        const PlanReport& r = tuned.report;
        if (json) {
          std::ostringstream chosen;
          chosen.precision(9);
          chosen << "{\"describe\":\"" << tuned.chosen.describe
                 << "\",\"predicted_step_s\":" << tuned.chosen.step_s << ",\"measured_step_s\":"
                 << (tuned.pick >= 0 ? tuned.trials[static_cast<size_t>(tuned.pick)].measured_s
                                     : 0.0)
                 << ",\"overrides\":[";
          for (size_t i = 0; i < tuned.chosen.overrides.size(); ++i) {
            std::string o;
            for (const char ch : tuned.chosen.overrides[i]) {
              if (ch == '"' || ch == '\\') o += '\\';
              o += ch;
            }
            chosen << (i ? "," : "") << '"' << o << '"';
          }
          chosen << "]}";
          std::cout << r.json.substr(0, r.json.size() - 1) << ",\"tuning\":" << trials_json(tuned)
                    << ",\"chosen\":" << chosen.str() << "}\n";
          return 0;
        }
        std::cout << "kolos: " << config_path << " on " << runtime.size() << " ranks, planned for "
                  << r.text << "\n"
                  << (tuned.trials.empty()
                          ? "kolos: plan --tune: fewer than two finalists; nothing "
                            "to try\n"
                          : format_trials(tuned, "plan --tune"))
                  << "\nthe pick as a run:";
        for (const auto& o : tuned.chosen.overrides) std::cout << " --set " << o;
        std::cout << "\n";
        return 0;
      });
}

}  // namespace kolos::cli
