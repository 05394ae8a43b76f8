// The planner role's plugin `autoplan` (kolos/core/planner.h): libkolos_planner's
// cost model and search, fed by this machine's calibration or a cluster
// file, with kolos's own checks as the last word on every plan it offers.
//
// [planner] keys: cluster (a cluster file: plan for those machines),
// calibration (a calibration file to use instead of this host's cache),
// top (plans kept, default 10), tune (finalists tried before training:
// the best K predictions and every plan within the margin, default 3; 0:
// none), tune_steps (steps per finalist, default 5), tune_seconds (the
// tuning's time bound, default 45).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "kolos/core/config_located.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/malloc_tuning.h"
#include "kolos/core/memory_estimate.h"
#include "kolos/core/planner.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/roles.h"
#include "kolos/core/runtime.h"
#include "kolos/core/sequence_modes.h"
#include "kolos/planner/search.h"
#include "kolos/planner/tune.h"

#include "calibration.h"

namespace kolos {
namespace {

namespace pl = kolos::planner;
namespace fs = std::filesystem;

struct Settings {
  std::string cluster, calibration;
  int64_t top = 10;
  int64_t tune = 3;
  TuneSettings trials;
};

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name[0] ? name : "localhost";
}

std::string cache_dir() {
  if (const char* d = std::getenv("KOLOS_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/kolos";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/kolos";
  return ".kolos-cache";
}

// Whether the config sets `key` ("parallel.tensor.size") itself, in its file
// or by --set; `tensor = 4` sets parallel.tensor.size.
bool given(const RunConfig& config, const std::string& table, const std::string& key,
           bool shorthand = false) {
  if (config.section(table).has(key)) return true;
  if (!shorthand) return false;
  const auto dot = table.rfind('.');
  return !config.section(table).present() &&
         config.section(table.substr(0, dot)).has(table.substr(dot + 1));
}

pl::Workload workload_of(const RunConfig& config) {
  const ModelConfig& m = config.model;
  if (m.name != "gpt") {
    throw ConfigError(located(config, "model.name",
                              "model.name = \"" + m.name +
                                  "\": the planner's cost model describes GPT only "
                                  "(model.name = \"gpt\"); plan this model by hand"));
  }
  pl::Workload w;
  w.model.name = m.name;
  w.model.layers = m.layers;
  w.model.hidden = m.hidden;
  w.model.heads = m.heads;
  w.model.seq_len = m.seq_len;
  w.model.vocab = m.vocab;
  w.model.ffn_multiplier = m.mlp_ratio;
  w.global_batch = config.train.global_batch;
  w.precision = config.train.precision;
  w.bucket_bytes = static_cast<double>(config.parallel.bucket_kb > 0
                                           ? config.parallel.bucket_kb * 1024
                                           : config.parallel.bucket_mb * 1024 * 1024);
  w.recompute_every = config.train.recompute_every;
  w.memory_role = !choose_plugins(config).memory.empty();
  w.heap_tuned = training_malloc().tuned;
  w.settings = role_settings(config);
  return w;
}

pl::Fixed fixed_of(const RunConfig& c) {
  pl::Fixed f;
  const auto& p = c.parallel;
  if (given(c, "parallel", "data") && p.data > 0) f.dp = p.data;
  if (given(c, "parallel.tensor", "size", true)) f.tp = p.tensor.size;
  if (given(c, "parallel.tensor", "mode")) f.tp_mode = p.tensor.mode;
  if (given(c, "parallel.pipeline", "size", true)) f.pp = p.pipeline.size;
  if (given(c, "parallel.pipeline", "schedule")) {
    std::string s;
    c.section("parallel.pipeline").read("schedule", s);
    f.schedule = s;
  }
  if (given(c, "parallel.sequence", "size", true)) f.sp = p.sequence.size;
  if (given(c, "parallel.sequence", "mode")) f.sp_mode = p.sequence.mode;
  if (given(c, "parallel.zero", "stage", true)) f.zero = p.zero.stage;
  if (given(c, "train", "micro_batch")) f.micro_batch = c.train.micro_batch;
  if (given(c, "train", "recompute")) f.recompute = c.train.recompute;
  return f;
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// The --set lines that turn a config into the run of candidate `c`.
std::vector<std::string> overrides_of(const pl::Candidate& c) {
  std::vector<std::string> o = {
      "parallel.auto=false",
      "parallel.data=" + std::to_string(c.dp),
      "parallel.tensor.size=" + std::to_string(c.tp),
      "parallel.pipeline.size=" + std::to_string(c.pp),
      "parallel.zero.stage=" + std::to_string(c.zero),
      "train.micro_batch=" + std::to_string(c.micro_batch),
      std::string("train.recompute=") + quoted(pl::to_string(c.recompute))};
  if (c.tp > 1) {
    o.push_back("parallel.tensor.mode=" + quoted(c.tp_mode));
    if (c.tp_depth > 1) o.push_back("parallel.tensor.depth=" + std::to_string(c.tp_depth));
  }
  if (c.pp > 1) {
    o.push_back(std::string("parallel.pipeline.schedule=") + quoted(pl::to_string(c.schedule)));
    if (c.schedule == pl::Schedule::kInterleaved) {
      o.push_back("parallel.pipeline.chunks=" + std::to_string(c.chunks));
    }
  }
  // A sequence mode over the tensor group runs with size 1.
  o.push_back("parallel.sequence.size=" + std::to_string(c.sp));
  if (!c.sp_mode.empty()) o.push_back("parallel.sequence.mode=" + quoted(c.sp_mode));
  if (c.ulysses > 1) o.push_back("parallel.sequence.ulysses=" + std::to_string(c.ulysses));
  return o;
}

// The candidate a config describes as it stands.
pl::Candidate candidate_of(const RunConfig& config, const RunPlan& plan) {
  pl::Candidate c;
  c.pp = plan.shape.pp, c.dp = plan.shape.dp, c.sp = plan.shape.sp, c.tp = plan.shape.tp;
  const auto& p = config.parallel;
  c.tp_mode = p.tensor.mode;
  if (given(config, "parallel.tensor", "depth")) {
    config.section("parallel.tensor").read("depth", c.tp_depth);
  }
  if (sequence_splits(p.sequence)) {
    c.sp_mode = p.sequence.mode;
    if (given(config, "parallel.sequence", "ulysses")) {
      config.section("parallel.sequence").read("ulysses", c.ulysses);
    }
  }
  if (c.pp > 1) {
    std::string s = "1f1b";
    config.section("parallel.pipeline").read("schedule", s);
    c.schedule = s == "gpipe"         ? pl::Schedule::kGPipe
                 : s == "interleaved" ? pl::Schedule::kInterleaved
                 : s == "zb"          ? pl::Schedule::kZeroBubble
                                      : pl::Schedule::k1F1B;
    config.section("parallel.pipeline").read("chunks", c.chunks);
  }
  c.microbatches = plan.accumulation;
  c.zero = static_cast<int>(p.zero.stage);
  c.micro_batch = config.train.micro_batch;
  const std::string& r = config.train.recompute;
  c.recompute = r == "full"        ? pl::Recompute::kFull
                : r == "selective" ? pl::Recompute::kSelective
                                   : pl::Recompute::kNone;
  return c;
}

// A refusal's words without its numbers and file position, so that the
// same reason for different sizes counts once.
std::string reason_of(const std::string& message) {
  std::string line = message.substr(0, message.find('\n'));
  static const std::regex position(R"(^[^ ]*:\d+(:\d+)?: )");
  line = std::regex_replace(line, position, "");
  static const std::regex number(R"(\d+(\.\d+)?)");
  line = std::regex_replace(line, number, "N");
  if (line.size() > 110) line = line.substr(0, 107) + "...";
  return "kolos refuses: " + line;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

// ---- the plugin ------------------------------------------------------

class Autoplan final : public Planner {
 public:
  void configure(const PluginContext& context) override {
    const ConfigSection& s = context.section;
    s.check_keys({"cluster", "calibration", "top", "tune", "tune_steps", "tune_seconds"},
                 context.owner);
    s.read("cluster", settings_.cluster);
    s.read("calibration", settings_.calibration);
    s.read("top", settings_.top);
    if (settings_.top < 1)
      s.fail("top", std::to_string(settings_.top) + " is out of range; it must be >= 1");
    s.read("tune", settings_.tune);
    if (settings_.tune < 0 || settings_.tune > settings_.top) {
      s.fail("tune", std::to_string(settings_.tune) +
                         " is out of range; it must be 0 (train the best prediction untried) "
                         "to planner.top = " +
                         std::to_string(settings_.top) +
                         " (the finalists come from the plans kept)");
    }
    s.read("tune_steps", settings_.trials.steps);
    if (settings_.trials.steps < settings_.trials.warmup + 1 || settings_.trials.steps > 1000) {
      s.fail("tune_steps", std::to_string(settings_.trials.steps) +
                               " is out of range; it must be 3 to 1000 (the first 2 of a "
                               "finalist's steps are not timed)");
    }
    s.read("tune_seconds", settings_.trials.budget_s);
    if (!(settings_.trials.budget_s > 0) || !std::isfinite(settings_.trials.budget_s)) {
      s.fail("tune_seconds",
             std::to_string(settings_.trials.budget_s) + " is out of range; it must be > 0");
    }
    for (const char* key : {"tune_steps", "tune_seconds"}) {
      if (settings_.tune == 0 && s.has(key)) {
        s.fail(key, std::string("has no effect with planner.tune = 0 (no finalist is tried); "
                                "remove it or set planner.tune >= 1"));
      }
    }
    for (const std::string* path : {&settings_.cluster, &settings_.calibration}) {
      if (!path->empty() && !fs::exists(*path)) {
        s.fail(path == &settings_.cluster ? "cluster" : "calibration",
               "\"" + *path + "\" does not exist");
      }
    }
    configured_ = true;
  }

  bool needs_calibration() const override { return settings_.cluster.empty(); }

  void check(const RunConfig& config) const override {
    workload_of(config).model.validate();
    if (!settings_.cluster.empty()) pl::load_cluster(settings_.cluster);
  }

  std::string calibration_path(int64_t ranks) const override {
    if (!settings_.calibration.empty()) return settings_.calibration;
    return cache_dir() + "/calibration/" + host_name() + "-n" + std::to_string(ranks) + ".toml";
  }

  std::string calibrate(const comm::ProcessGroupPtr& world, const RunConfig& config) override {
    const pl::MachineRates rates = autoplan::measure(world, config);
    const std::string path = calibration_path(world->size());
    dp_references_.clear();  // the references recorded next are this calibration's
    measured_group_sync_.clear();
    std::string error;
    if (world->rank() == 0) {
      try {
        fs::create_directories(fs::path(path).parent_path());
        const std::string tmp = path + ".tmp";
        std::ofstream out(tmp);
        out << "# " << world->size() << " ranks of " << at::get_num_threads()
            << " thread(s); attention and elementwise at seq_len " << config.model.seq_len
            << ", hidden " << config.model.hidden << ", heads " << config.model.heads << "\n"
            << pl::format_calibration(host_name(), rates);
        out.close();
        if (!out) throw Error(tmp + ": cannot write");
        fs::rename(tmp, path);
      } catch (const std::exception& e) {
        error = std::string("calibration: ") + e.what();
      }
    }
    detail::agree_on_error(*world, error, static_cast<int>(ErrorKind::kGeneric));
    return path;
  }

  // The dp reference (tensor and sequence sizes 1) sets the step factor:
  // measured over predicted. A reference in a tensor grid mode (2d, 2.5d,
  // 3d) or in ring sequence parallelism sets, with shared cores, what each
  // of the grid's collectives or the ring's hops costs beyond the model
  // (grid_sync or ring_sync at its size): the part of the measured step the
  // prediction without it leaves over, spread over the collectives the
  // prediction counts on the step's path (its slope in that term). A
  // reference in tensor 1d sets the same for a plain group's collectives
  // (sync, every group size up to its own, never below what the
  // calibration's small all-reduce measured; a later reference in smaller
  // groups replaces the rows up to its size): in training a collective
  // waits for peers that are computing, which that all-reduce, issued right
  // after identical compute on every rank, does not see.
  void record_reference(const RunConfig& reference, int64_t ranks, double measured) override {
    const std::string path = calibration_path(ranks);
    std::string unused;
    pl::Machine mach = machine_for(reference, ranks, &unused);
    const RunPlan plan = plan_run(reference, ranks);
    const pl::Workload w = workload_of(reference);
    const pl::Candidate c = candidate_of(reference, plan);
    // What the reference's collectives wait for, as its plugins issue them.
    // A tensor grid's, or (without a tensor group) a ring's.
    bool grid = false, ring = false;
    int64_t grid_span = 0, ring_span = 0;
    const MemoryQuery q = pl::memory_query(w, c);
    for (const std::string& plugin : {q.layers, q.sequence}) {
      for (const CollectiveCall& call : plugin_traffic(plugin, q)) {
        if (call.sync == SyncPattern::kGrid) grid = true, grid_span = call.span;
        if (call.sync == SyncPattern::kRing) ring = true, ring_span = call.span;
      }
    }
    ring = ring && !grid && c.tp == 1;
    const bool group = !grid && !ring && c.tp > 1;
    const int64_t span = grid ? grid_span : ring ? ring_span : c.tp;
    std::string what;
    if (!grid && !ring && !group) {
      // Data parallel: kept (one per micro-batch count) for the pair fit.
      dp_references_.erase(std::remove_if(dp_references_.begin(), dp_references_.end(),
                                          [&](const DpReference& r) {
                                            return r.candidate.microbatches == c.microbatches;
                                          }),
                           dp_references_.end());
      if (dp_references_.empty()) blocks_fixed_ = mach.rates.block_fixed;
      dp_references_.push_back({w, c, measured});
      mach.rates.step_factor = 1;
      const double predicted = pl::predict(w, mach, c).step;
      mach.rates.step_factor = measured / predicted;
      std::ostringstream line;
      line << "; reference " << c.describe() << ": measured " << measured << " s, predicted "
           << predicted << " s";
      if (dp_references_.size() >= 2) line << fit_block_fixed(mach);
      what = line.str();
    } else {
      std::map<int64_t, double>& table = grid   ? mach.rates.grid_sync
                                         : ring ? mach.rates.ring_sync
                                                : mach.rates.sync;
      // A group's floor: the small all-reduce's rows, as the calibration
      // measured them before any group reference replaced them.
      if (group && measured_group_sync_.empty()) measured_group_sync_ = table;
      // A grid's or a ring's wait at its size; a group's at every size up to its own.
      const auto set = [&](double seconds) {
        if (group) {
          for (auto& [size, s] : table) {
            if (size <= span) s = seconds;
          }
        }
        table[span] = seconds;
      };
      set(0);
      const double without = pl::predict(w, mach, c).step;
      const double probe = 1e-3;
      set(probe);
      const double slope = (pl::predict(w, mach, c).step - without) / probe;
      const double wait = slope > 0 ? std::max(0.0, (measured - without) / slope) : 0.0;
      set(wait);
      if (group) {
        for (const auto& [size, s] : measured_group_sync_) {
          if (size <= span) table[size] = std::max(s, wait);
        }
      }
      std::ostringstream line;
      line << "; "
           << (grid   ? "grid"
               : ring ? "ring"
                      : "group")
           << " reference " << c.describe() << ": measured " << measured << " s, predicted "
           << without << " s without its sync, " << wait * 1e6 << " us per collective";
      what = line.str();
    }
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);  // the comment line calibrate() wrote, and earlier references'
    const std::string tmp = path + ".tmp";
    std::ofstream out(tmp);
    out << first << what << "\n" << pl::format_calibration(host_name(), mach.rates);
    out.close();
    if (!out) throw Error(tmp + ": cannot write");
    fs::rename(tmp, path);
  }

  // Each measured finalist's measured / model ratio, over the median of
  // this tuning's (tune.h relative_to_median), joins its family's
  // [[calibration.feedback]] row in the calibration in use (rank 0 only:
  // the file is rewritten whole, through a temporary file and a rename).
  std::string record_trials(int64_t ranks, const std::vector<TrialResult>& trials) override {
    if (!settings_.cluster.empty()) return "";
    const std::string path = calibration_path(ranks);
    pl::MachineRates rates = pl::load_calibration(path, {});
    std::vector<std::string> families;
    std::vector<double> ratios;
    for (const TrialResult& t : trials) {
      if (!t.skipped.empty() || !(t.measured_s > 0) || !(t.plan.model_step_s > 0)) continue;
      families.push_back(t.plan.family);
      ratios.push_back(t.measured_s / t.plan.model_step_s);
    }
    const std::vector<double> relative = pl::relative_to_median(ratios);
    if (relative.empty()) return "";
    for (size_t i = 0; i < relative.size(); ++i) pl::add_feedback(rates, families[i], relative[i]);
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);
    const std::string tmp = path + ".tmp";
    std::ofstream out(tmp);
    if (first.rfind("#", 0) == 0) out << first << "\n";  // calibrate()'s line, and the references'
    out << pl::format_calibration(host_name(), rates);
    out.close();
    if (!out) throw Error(tmp + ": cannot write");
    fs::rename(tmp, path);
    return path;
  }

  PlanReport plan(const RunConfig& config, int64_t ranks) override {
    return run(config, ranks, /*search=*/true);
  }
  PlanReport predict(const RunConfig& config, int64_t ranks) override {
    return run(config, ranks, /*search=*/false);
  }

 private:
  // A data-parallel reference this calibration recorded.
  struct DpReference {
    pl::Workload workload;
    pl::Candidate candidate;
    double measured = 0;
  };
  // Two data-parallel references of one layout and global batch, at M1 < M2
  // micro-batches (record_reference keeps one per count), differ in what every block pays per
  // micro-batch whatever its size (kernel dispatch, autograd's bookkeeping, the micro-batch's own
  // passes): the block fixed cost that makes the model's ratio of the two steps the measured one
  // replaces the block measurements' (a fit of single blocks, which noise often leaves at 0), and
  // the step factor is then the first's measured over predicted. Returns the line's note.
  std::string fit_block_fixed(pl::Machine& mach) const {
    const DpReference* a = &dp_references_[0];
    const DpReference* b = &dp_references_[1];
    if (a->candidate.microbatches > b->candidate.microbatches) std::swap(a, b);
    const double target = b->measured / a->measured;
    const auto ratio = [&](double fixed) {
      mach.rates.block_fixed = fixed;
      mach.rates.step_factor = 1;
      return pl::predict(b->workload, mach, b->candidate).step /
             pl::predict(a->workload, mach, a->candidate).step;
    };
    double fixed = 0;
    if (ratio(0) < target) {
      // The ratio grows with the fixed cost (the second has more
      // micro-batches): bracket, then bisect.
      double lo = 0, hi = 1e-3;
      while (ratio(hi) < target && hi < 10) lo = hi, hi *= 2;
      for (int i = 0; i < 60; ++i) {
        const double mid = 0.5 * (lo + hi);
        (ratio(mid) < target ? lo : hi) = mid;
      }
      fixed = 0.5 * (lo + hi);
    }
    mach.rates.block_fixed = fixed;
    mach.rates.step_factor = 1;
    mach.rates.step_factor = a->measured / pl::predict(a->workload, mach, a->candidate).step;
    std::ostringstream note;
    note << " (M=" << a->candidate.microbatches << " and M=" << b->candidate.microbatches
         << ", measured " << a->measured << " and " << b->measured << " s: block_fixed "
         << fixed * 1e3 << " ms per block and micro-batch, the blocks' " << blocks_fixed_ * 1e3
         << " ms)";
    return note.str();
  }

  std::vector<DpReference> dp_references_;
  double blocks_fixed_ = 0;  // block_fixed as the block measurements fitted it
  // The group sync rows of this calibration's small all-reduce (the floor
  // of every group reference's fit), kept when the first one replaces them.
  std::map<int64_t, double> measured_group_sync_;

  pl::Machine machine_for(const RunConfig& config, int64_t ranks, std::string* what) const {
    if (!settings_.cluster.empty()) {
      pl::ClusterFile file = pl::load_cluster(settings_.cluster);
      if (!settings_.calibration.empty()) {
        file.rates = pl::load_calibration(settings_.calibration, file.rates);
      }
      *what = "cluster " + settings_.cluster + " (" + file.cluster.name +
              "), rates: " + file.rates.source;
      return {file.cluster, file.rates};
    }
    const std::string path = calibration_path(ranks);
    if (!fs::exists(path)) {
      throw ConfigError("no calibration of this machine for " + std::to_string(ranks) + " ranks (" +
                        path + "); `kolos calibrate CONFIG -n " + std::to_string(ranks) +
                        "` measures it");
    }
    pl::MachineRates rates = pl::load_calibration(path, {});
    pl::Cluster c;
    c.name = host_name();
    c.source = path;
    c.nodes = 1;
    c.devices_per_node = ranks;
    const MemoryBudget budget = memory_budget(config, ranks);
    c.device_memory = budget.bytes;
    c.peak_flops = rates.gemm_flops;
    c.memory_bandwidth = rates.elementwise_bytes;
    // Every pair the calibration did not measure falls back to these: its
    // all-reduce over the whole machine, as a ring.
    const auto it = rates.measured.find({pl::Collective::kAllReduce, ranks});
    const double n = static_cast<double>(ranks);
    c.intra_bandwidth = c.inter_bandwidth =
        it != rates.measured.end() ? it->second.beta * 2 * (n - 1) / n : rates.elementwise_bytes;
    c.intra_latency = c.inter_latency =
        it != rates.measured.end() ? it->second.alpha / std::max(1.0, 2 * (n - 1)) : 0;
    c.nvlink_domain = ranks;
    c.host_bandwidth = rates.elementwise_bytes;
    c.host_memory = budget.bytes * n;
    c.host_is_device = true;
    c.runtime_bytes = resident_bytes();
    *what = "this machine (" + c.name + ", " + std::to_string(ranks) + " ranks; calibration " +
            path + "; memory " + budget.source + ")";
    return {c, rates};
  }

  // The planner costs a candidate's memory with the function kolos's
  // estimate calls (rank_memory): a difference means the planner described
  // the candidate otherwise than kolos reads the run it prints, a defect.
  static void agree_on_memory(const pl::Candidate& c, double planner, double kolos) {
    if (std::abs(planner - kolos) > 1e-9 * kolos) {
      throw std::logic_error("the planner's memory for " + c.describe() + " (" +
                             std::to_string(planner) + " B) is not kolos's estimate of the run (" +
                             std::to_string(kolos) + " B)");
    }
  }

  // kolos's own verdict on candidate `c`: the run it makes must pass
  // plan_run, and its memory estimate must fit the budget.
  std::string accept(const RunConfig& base, const std::string& text, int64_t ranks,
                     const pl::Candidate& c, pl::Prediction& p, double runtime_bytes,
                     double budget) const {
    MemoryEstimate estimate;
    try {
      RunConfig run = parse_run_config(text, base.source, overrides_of(c));
      plan_run(run, ranks);
      estimate = estimate_memory(run, ranks, runtime_bytes);
    } catch (const std::exception& e) {
      return reason_of(e.what());
    }
    agree_on_memory(c, p.memory, estimate.peak());
    if (estimate.peak() > budget) return "memory: kolos's estimate exceeds the rank's budget";
    return "";
  }

  PlanReport run(const RunConfig& config, int64_t ranks, bool search) const {
    KOLOS_CHECK(configured_, "the planner plugin was not configured");
    const pl::Workload w = workload_of(config);
    PlanReport report;
    const pl::Machine mach = machine_for(config, ranks, &report.machine);
    const bool here = settings_.cluster.empty();
    const std::string text = to_toml(config);
    const double budget = mach.cluster.device_memory;
    pl::SearchResult result;
    if (!search) {
      const RunPlan plan = plan_run(config, ranks);
      const pl::Candidate c = candidate_of(config, plan);
      pl::RankedPlan rp{c, pl::predict(w, mach, c)};
      if (here) {
        const double kolos = estimate_memory(config, ranks, mach.cluster.runtime_bytes).peak();
        agree_on_memory(c, rp.prediction.memory, kolos);
      }
      result.plans.push_back(rp);
      result.evaluated = result.survived = 1;
    } else {
      pl::SearchOptions opt;
      opt.ranks = ranks;
      opt.top = static_cast<size_t>(settings_.top);
      opt.fixed = fixed_of(config);
      if (here) {
        // On this machine the memory role is not planned: its compute
        // budget and chunk size are the user's to set ([memory]).
        opt.offload_fractions = {0.0};
        opt.refine = 100000;
        opt.accept = [&](const pl::Candidate& c, pl::Prediction& p) {
          return accept(config, text, ranks, c, p, mach.cluster.runtime_bytes, budget);
        };
      }
      result = pl::check_fixed(w, mach, opt);
    }
    // The memory role's chunks run whichever plan is chosen (they compose
    // with every layout), but their tier traffic is not modelled here.
    const std::string memory_role = here ? choose_plugins(config).memory : "";
    if (!memory_role.empty()) {
      report.machine += "; the memory role (" + memory_role +
                        ") is on: its traffic between the compute budget and the lower tier is "
                        "not in these predictions";
    }
    report.text = report.machine + "\n" + pl::format_plans(result, w, mach);
    std::ostringstream json;
    json.precision(9);
    json << "{\"machine\":" << json_string(report.machine) << ",\"evaluated\":" << result.evaluated
         << ",\"survived\":" << result.survived << ",\"top\":" << result.top << ",\"plans\":[";
    for (size_t i = 0; i < result.plans.size(); ++i) {
      const pl::RankedPlan& rp = result.plans[i];
      PlannedRun pr;
      pr.overrides = overrides_of(rp.candidate);
      pr.describe = rp.candidate.describe();
      pr.step_s = rp.prediction.step;
      pr.memory_bytes = rp.prediction.memory;
      pr.bytes_per_step = rp.prediction.bytes_sent;
      pr.uncertainty = rp.prediction.uncertainty;
      pr.family = pl::family_of(rp.candidate);
      pr.model_step_s = rp.prediction.step / rp.prediction.feedback;
      json << (i ? "," : "") << "{\"describe\":" << json_string(pr.describe)
           << ",\"step_s\":" << pr.step_s << ",\"compute_s\":" << rp.prediction.compute
           << ",\"comm_s\":" << rp.prediction.comm << ",\"bubble_s\":" << rp.prediction.bubble
           << ",\"optimizer_s\":" << rp.prediction.optimizer
           << ",\"memory_bytes\":" << pr.memory_bytes << ",\"bytes_per_step\":" << pr.bytes_per_step
           << ",\"uncertainty\":" << pr.uncertainty << ",\"model_step_s\":" << pr.model_step_s
           << ",\"family\":" << json_string(pr.family)
           << ",\"layout\":" << json_string(rp.candidate.layout()) << ",\"overrides\":[";
      for (size_t k = 0; k < pr.overrides.size(); ++k) {
        json << (k ? "," : "") << json_string(pr.overrides[k]);
      }
      json << "]}";
      report.plans.push_back(std::move(pr));
    }
    // The finalists parallel.auto (and kolos plan --tune) tries.
    report.tune = settings_.trials;
    if (search && settings_.tune > 0 && !result.plans.empty()) {
      std::vector<pl::Predicted> predicted;
      for (const pl::RankedPlan& rp : result.plans)
        predicted.push_back({rp.prediction.step, rp.prediction.uncertainty, rp.candidate.layout(),
                             pl::zero_sibling(rp.candidate),
                             rp.candidate.pp == 1 && rp.candidate.sp == 1 && rp.candidate.tp == 1});
      report.finalists = pl::select_finalists(predicted, settings_.tune);
      const pl::Predicted best = *std::min_element(
          predicted.begin(), predicted.end(),
          [](const pl::Predicted& a, const pl::Predicted& b) { return a.step < b.step; });
      double lo = 1e300, hi = 0;
      for (const pl::Predicted& p : predicted) {
        const double m = pl::margin_of(best, p);
        lo = std::min(lo, m), hi = std::max(hi, m);
      }
      char rule[256];
      std::snprintf(rule, sizeof rule,
                    "the best %lld prediction(s) and every plan within %.0f combined standard "
                    "deviations of the best (a margin of %.1f%%%s here)",
                    static_cast<long long>(settings_.tune), pl::kMarginSigmas, 100 * lo,
                    hi > lo * 1.001
                        ? (hi > 10 ? " to over 1000%"
                                   : (" to " + std::to_string(std::lround(100 * hi)) + "%").c_str())
                        : "");
      report.finalist_rule = rule;
      std::ostringstream line;
      line << "\nFinalists (parallel.auto and kolos plan --tune try them, in this order: the "
              "best prediction, its other ZeRO stages, the best plain data-parallel plan, the "
              "best of each other layout, the rest):";
      for (const size_t i : report.finalists) line << " #" << i + 1;
      line << ": " << report.finalist_rule << ".\n";
      report.text += line.str();
    }
    json << "],\"finalists\":[";
    for (size_t i = 0; i < report.finalists.size(); ++i)
      json << (i ? "," : "") << report.finalists[i];
    json << "],\"dropped\":{";
    bool first = true;
    for (const auto& [reason, count] : result.dropped) {
      json << (first ? "" : ",") << json_string(reason) << ":" << count;
      first = false;
    }
    json << "}}";
    report.json = json.str();
    return report;
  }

  Settings settings_;
  bool configured_ = false;
};

}  // namespace
}  // namespace kolos

KOLOS_DEFINE_PLUGIN("autoplan", "planner", kolos::Planner, kolos::Autoplan,
                    "chooses dp/tp/pp/sp/ZeRO/recompute from a cost model calibrated on this "
                    "machine or a cluster file (kolos plan, parallel.auto)")
