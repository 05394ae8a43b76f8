// The search over every valid candidate (search.h). Structure is checked
// outermost first, so a reason found at the mesh level counts every
// candidate below it (its micro-batch sizes, schedules, ZeRO stages,
// recomputation and offload choices): the counts add up to `evaluated`.
#include "kolos/planner/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <queue>
#include <set>
#include <string>

#include "kolos/core/error.h"
#include "kolos/core/plugin_terms.h"
#include "kolos/planner/cost_model.h"
#include "kolos/schedules/plan.h"
#include "schedule_kind.h"

namespace kolos::planner {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// A plugin's verdict on a layout ("" fine); a plugin without layout rules
// (the serial built-in, no sequence plugin) takes every layout.
std::string layout_problem(const std::string& plugin, const LayoutQuery& layout) {
  const PluginTerms* t = plugin.empty() ? nullptr : plugin_terms(plugin);
  return t != nullptr && t->layout_problem != nullptr ? t->layout_problem(layout) : "";
}

// The sequence layouts for sp ranks beside `tensor`: none when sp = 1, and
// what every sequence plugin offers.
std::vector<LayoutQuery> sequence_layouts(const LayoutQuery& tensor, int64_t sp) {
  LayoutQuery mesh = tensor;
  mesh.sp = sp;
  std::vector<LayoutQuery> out;
  if (sp == 1) out.push_back(mesh);
  for (LayoutQuery& l : offered_layouts("sequence", mesh)) out.push_back(std::move(l));
  return out;
}

struct ScheduleChoice {
  Schedule kind;
  int64_t chunks = 1;
};

std::vector<ScheduleChoice> schedule_choices(int64_t pp, int64_t max_chunks) {
  if (pp == 1) return {{Schedule::kNone}};
  std::vector<ScheduleChoice> out{{Schedule::kGPipe}, {Schedule::k1F1B}, {Schedule::kZeroBubble}};
  for (int64_t v = 2; v <= max_chunks; v *= 2) out.push_back({Schedule::kInterleaved, v});
  return out;
}

const Recompute kRecomputes[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};

// The order in which constraints are applied; the killer is the reason of
// the highest stage that dropped anything when nothing survives.
enum Stage {
  kStageTensor,
  kStageSequence,
  kStageBatch,
  kStagePipeline,
  kStageMode,
  kStageMemory,
};

struct Tally {
  std::map<std::string, int64_t>* dropped;
  std::map<std::string, int>* stage_of;
  void drop(const std::string& reason, Stage stage, int64_t count) {
    (*dropped)[reason] += count;
    (*stage_of)[reason] = stage;
  }
};

bool matches(const Fixed& f, const Candidate& c) {
  if (f.pp && *f.pp != c.pp) return false;
  if (f.dp && *f.dp != c.dp) return false;
  // A sequence plugin that runs with sp = 1 splits over the tensor group.
  if (f.sp && *f.sp != (!c.sp_mode.empty() && c.sp == 1 ? c.tp : c.sp)) return false;
  if (f.tp && *f.tp != c.tp) return false;
  // A fixed mode asks for its axis: a mode offered only on several tensor
  // ranks (a grid) needs tp > 1; a schedule pp > 1.
  if (f.tp_mode && *f.tp_mode != c.tp_mode) return false;
  if (f.sp_mode && *f.sp_mode != c.sp_mode) return false;
  if (f.schedule && (c.pp == 1 || *f.schedule != to_string(c.schedule))) return false;
  return true;
}

struct Quick {
  double step;
  Candidate candidate;
  bool operator<(const Quick& o) const { return step < o.step; }
};

}  // namespace

SearchResult search(const Workload& w, const Machine& mach, const SearchOptions& opt) {
  const auto start = std::chrono::steady_clock::now();
  const ModelShape& m = w.model;
  m.validate();
  if (w.global_batch <= 0) throw ConfigError("train.global_batch must be positive for the planner");
  const int64_t N = opt.ranks > 0 ? opt.ranks : mach.cluster.devices();
  if (N > mach.cluster.devices()) {
    throw ConfigError(std::to_string(N) + " ranks asked for, but " + mach.cluster.source + " has " +
                      std::to_string(mach.cluster.devices()) + " devices");
  }
  SearchResult result;
  std::map<std::string, int> stage_of;
  Tally tally{&result.dropped, &stage_of};
  const Fixed& fx = opt.fixed;
  const int64_t n_off = static_cast<int64_t>(opt.offload_fractions.size());
  const int64_t n_zero = fx.zero ? 1 : 4;
  const int64_t n_rec = fx.recompute ? 1 : 3;
  std::priority_queue<Quick> best;  // the `refine` fastest by the closed form (a max-heap)
  double least_memory = -1;
  Candidate least_candidate;
  double least_host = -1;  // the smallest host memory an offloaded plan dropped for it needed
  Candidate least_host_candidate;
  std::vector<MemoryPart> least_parts;

  for (const int64_t pp : divisors(N)) {
    if (fx.pp && *fx.pp != pp) continue;
    const auto schedules = schedule_choices(pp, opt.max_chunks);
    for (const int64_t tp : divisors(N / pp)) {
      if (fx.tp && *fx.tp != tp) continue;
      LayoutQuery mesh;
      mesh.heads = m.heads, mesh.kv_heads = m.kv(), mesh.inner = m.ffn();
      mesh.seq = m.seq_len, mesh.tp = tp;
      // The layouts the layers' and the sequence plugins offer.
      for (const LayoutQuery& tc : offered_layouts("layers", mesh)) {
        for (const int64_t sp : divisors(N / pp / tp)) {
          const int64_t dp = N / pp / tp / sp;
          for (LayoutQuery layout : sequence_layouts(tc, sp)) {
            Candidate c;
            c.pp = pp, c.dp = dp, c.sp = sp, c.tp = tp;
            c.tp_mode = layout.tensor_mode, c.tp_depth = layout.depth;
            c.sp_mode = layout.sequence_mode, c.ulysses = layout.ulysses;
            if (!matches(fx, c)) continue;
            std::vector<int64_t> mbs = opt.micro_batches;
            if (fx.micro_batch) mbs = {*fx.micro_batch};
            const int64_t below_mb =
                static_cast<int64_t>(schedules.size()) * n_zero * n_rec * n_off;
            const int64_t below_mesh = static_cast<int64_t>(mbs.size()) * below_mb;
            result.evaluated += below_mesh;
            // The tensor and sequence plugins' own rules (their terms,
            // kolos/core/plugin_terms.h).
            const RoleChoice plugins = plugins_of(c);
            if (const std::string bad = layout_problem(plugins.layers, layout); !bad.empty()) {
              tally.drop(bad, kStageTensor, below_mesh);
              continue;
            }
            if (const std::string bad = layout_problem(plugins.sequence, layout); !bad.empty()) {
              tally.drop(bad, kStageSequence, below_mesh);
              continue;
            }
            // Selective recomputation drops the attention's probabilities:
            // none where the sequence plugin keeps none.
            const AttentionMemory attention =
                attention_memory(memory_query(w, c), 1, static_cast<double>(m.seq_len / sp));
            const std::string no_selective =
                attention.probabilities > 0
                    ? ""
                    : "recompute: selective is none under the " + attention.kernel;
            for (const int64_t mb : mbs) {
              c.micro_batch = mb;
              if (w.global_batch % (mb * dp) != 0) {
                tally.drop("batch: global batch not divisible by micro_batch x dp", kStageBatch,
                           below_mb);
                continue;
              }
              layout.micro_batch = mb;
              if (const std::string bad = layout_problem(plugins.layers, layout); !bad.empty()) {
                tally.drop(bad, kStageTensor, below_mb);
                continue;
              }
              c.microbatches = w.global_batch / (mb * dp);
              const int64_t below_schedule = n_zero * n_rec * n_off;
              for (const ScheduleChoice& sch : schedules) {
                c.schedule = sch.kind, c.chunks = sch.chunks;
                if (fx.schedule && pp > 1 && *fx.schedule != to_string(sch.kind)) {
                  result.evaluated -= below_schedule;
                  continue;
                }
                // An even cut: layers, or blocks (layers, the embedding and the
                // head), divisible by pp.
                if (m.layers % pp != 0 && (m.layers + 2) % pp != 0) {
                  tally.drop("pp: neither layers nor layers + 2 divisible by pp", kStagePipeline,
                             below_schedule);
                  continue;
                }
                // kolos's interleaved schedule gives every virtual stage the
                // same number of blocks, and the embedding and the head are
                // blocks of their own (docs/pipeline.md).
                if (sch.kind == Schedule::kInterleaved && (m.layers + 2) % (pp * sch.chunks) != 0) {
                  tally.drop(
                      "pp: interleaved needs layers + 2 (embedding, head) divisible by pp x "
                      "chunks",
                      kStagePipeline, below_schedule);
                  continue;
                }
                if (pp > 1) {
                  const std::string problem = pipeline::plan_problem(
                      schedule_kind(sch.kind), static_cast<int>(pp),
                      static_cast<int>(c.microbatches), static_cast<int>(sch.chunks));
                  if (!problem.empty()) {
                    tally.drop(sch.kind == Schedule::kInterleaved && c.microbatches >= pp
                                   ? "pp: interleaved needs micro-batches a multiple of pp"
                                   : "pp: fewer micro-batches than stages",
                               kStagePipeline, below_schedule);
                    continue;
                  }
                }
                for (int zero = 0; zero <= 3; ++zero) {
                  if (fx.zero && *fx.zero != zero) continue;
                  c.zero = zero;
                  for (const Recompute rec : kRecomputes) {
                    if (fx.recompute && *fx.recompute != to_string(rec)) continue;
                    c.recompute = rec;
                    for (const double off : opt.offload_fractions) {
                      c.offload = off;
                      if (zero > 0 && dp * sp == 1) {
                        tally.drop("zero: no data-parallel group to shard over", kStageMode, 1);
                        continue;
                      }
                      if (rec == Recompute::kSelective && !no_selective.empty()) {
                        tally.drop(no_selective, kStageMode, 1);
                        continue;
                      }
                      std::vector<MemoryPart> parts;
                      double host_tier = 0;
                      const double mem = memory_per_rank(w, c, mach.cluster, &parts, &host_tier);
                      if (off > 0) {
                        // The memory role's host tier holds a copy of every
                        // chunk, for each rank of the node.
                        const double host =
                            host_tier * static_cast<double>(mach.cluster.devices_per_node);
                        if (host > mach.cluster.host_memory) {
                          tally.drop("offload: host memory", kStageMemory, 1);
                          if (least_host < 0 || host < least_host) {
                            least_host = host, least_host_candidate = c;
                          }
                          continue;
                        }
                      }
                      if (mem > mach.cluster.device_memory) {
                        tally.drop("memory: exceeds device memory", kStageMemory, 1);
                        if (least_memory < 0 || mem < least_memory) {
                          least_memory = mem, least_candidate = c, least_parts = parts;
                        }
                        continue;
                      }
                      ++result.survived;
                      const Prediction p = predict(w, mach, c, /*simulate_pipeline=*/false);
                      if (best.size() < opt.refine) {
                        best.push({p.step, c});
                      } else if (p.step < best.top().step) {
                        best.pop();
                        best.push({p.step, c});
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }

  // Second pass: the pipeline plugin's schedules, simulated.
  std::vector<RankedPlan> ranked;
  while (!best.empty()) {
    const Candidate c = best.top().candidate;
    best.pop();
    ranked.push_back({c, predict(w, mach, c, /*simulate_pipeline=*/true)});
  }
  std::sort(ranked.begin(), ranked.end(), [](const RankedPlan& a, const RankedPlan& b) {
    return a.prediction.step < b.prediction.step;
  });
  if (opt.accept) {
    // The caller's last word (kolos's own checks of the run each plan
    // makes), fastest first, until `top` plans are accepted.
    // Past the top (and room for the tie-break below), only the first
    // accepted plan of each layout not yet seen is asked about.
    std::vector<RankedPlan> accepted;
    std::set<std::string> seen;
    size_t others = 0;
    for (RankedPlan& plan : ranked) {
      const bool top = accepted.size() < opt.top + 8;
      std::string layout = plan.candidate.layout();
      if (!top && others >= opt.layouts) break;
      if (!top && seen.count(layout)) continue;
      const std::string refusal = opt.accept(plan.candidate, plan.prediction);
      if (refusal.empty()) {
        others += top ? 0 : 1;
        seen.insert(std::move(layout));
        accepted.push_back(std::move(plan));
      } else {
        --result.survived;
        tally.drop(refusal, kStageMemory, 1);
      }
    }
    ranked = std::move(accepted);
  }
  // Steps within 1% of each other are a tie; ties go to fewer groups that
  // span nodes, then to the faster.
  auto bucket = [](double step) { return std::floor(std::log(step) / std::log(1.01)); };
  std::sort(ranked.begin(), ranked.end(), [&](const RankedPlan& a, const RankedPlan& b) {
    const double ba = bucket(a.prediction.step), bb = bucket(b.prediction.step);
    if (ba != bb) return ba < bb;
    if (a.prediction.crossing_groups != b.prediction.crossing_groups) {
      return a.prediction.crossing_groups < b.prediction.crossing_groups;
    }
    return a.prediction.step < b.prediction.step;
  });
  // Kept: the top, then the best of each layout that has no plan among them.
  std::set<std::string> seen;
  for (RankedPlan& plan : ranked) {
    std::string layout = plan.candidate.layout();
    if (result.plans.size() >= opt.top + opt.layouts) break;
    if (result.plans.size() < opt.top) {
      ++result.top;
    } else if (seen.count(layout)) {
      continue;
    }
    seen.insert(std::move(layout));
    result.plans.push_back(std::move(plan));
  }

  if (result.plans.empty()) {
    int last = -1;
    std::string reason;
    int64_t count = 0;
    for (const auto& [r, n] : result.dropped) {
      const int st = stage_of[r];
      if (st > last || (st == last && n > count)) last = st, reason = r, count = n;
    }
    // Of the two memory constraints the device's is named first (with the
    // closest plan's terms), the host's after it.
    const std::string kDevice = "memory: exceeds device memory";
    if (last == kStageMemory && result.dropped.count(kDevice)) {
      reason = kDevice, count = result.dropped.at(kDevice);
    }
    if (result.evaluated == 0) {
      result.killer =
          "no candidate: the fixed sizes do not divide the " + std::to_string(N) + " ranks";
    } else {
      result.killer =
          "\"" + reason + "\" removed the last " + std::to_string(count) + " candidates";
      if (last == kStageMemory && least_memory > 0) {
        const auto largest = std::max_element(
            least_parts.begin(), least_parts.end(),
            [](const MemoryPart& a, const MemoryPart& b) { return a.bytes < b.bytes; });
        const double gib = 1024.0 * 1024 * 1024;
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "; the smallest needs %.1f GiB per rank (%s), the device has %.1f GiB; its "
                      "largest term: %s, %.1f GiB",
                      least_memory / gib, least_candidate.describe().c_str(),
                      mach.cluster.device_memory / gib, largest->name.c_str(),
                      largest->bytes / gib);
        result.killer += buf;
      }
      if (last == kStageMemory && least_host > 0 && reason != "offload: host memory") {
        const double gib = 1024.0 * 1024 * 1024;
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "; \"offload: host memory\" removed %lld more: the smallest offloaded "
                      "plan's host tier needs %.1f GiB per node (%s), the node has %.1f GiB",
                      static_cast<long long>(result.dropped.at("offload: host memory")),
                      least_host / gib, least_host_candidate.describe().c_str(),
                      mach.cluster.host_memory / gib);
        result.killer += buf;
      }
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

SearchResult check_fixed(const Workload& w, const Machine& mach, const SearchOptions& opt) {
  SearchResult all = search(w, mach, opt);
  if (!all.plans.empty()) return all;
  const Fixed& f = opt.fixed;
  struct Given {
    std::string text;
    Fixed only;
  };
  std::vector<Given> given;
  auto num = [&](const char* key, const std::optional<int64_t>& v,
                 std::optional<int64_t> Fixed::*member) {
    if (!v) return;
    Fixed one;
    one.*member = v;
    given.push_back({std::string(key) + " = " + std::to_string(*v), one});
  };
  auto str = [&](const char* key, const std::optional<std::string>& v,
                 std::optional<std::string> Fixed::*member) {
    if (!v) return;
    Fixed one;
    one.*member = v;
    given.push_back({std::string(key) + " = \"" + *v + "\"", one});
  };
  num("parallel.pipeline.size", f.pp, &Fixed::pp);
  num("parallel.data", f.dp, &Fixed::dp);
  num("parallel.sequence.size", f.sp, &Fixed::sp);
  num("parallel.tensor.size", f.tp, &Fixed::tp);
  num("parallel.zero.stage", f.zero, &Fixed::zero);
  num("train.micro_batch", f.micro_batch, &Fixed::micro_batch);
  str("parallel.tensor.mode", f.tp_mode, &Fixed::tp_mode);
  str("parallel.sequence.mode", f.sp_mode, &Fixed::sp_mode);
  str("parallel.pipeline.schedule", f.schedule, &Fixed::schedule);
  str("train.recompute", f.recompute, &Fixed::recompute);
  if (given.empty()) throw ConfigError("no plan fits: " + all.killer);
  std::string message;
  for (const Given& g : given) {
    SearchOptions one = opt;
    one.fixed = g.only;
    const SearchResult r = search(w, mach, one);
    if (r.plans.empty()) {
      message += (message.empty() ? "" : "\n") + g.text + ": parallel.auto = true finds no plan " +
                 "with it: " + r.killer;
    }
  }
  if (message.empty()) {
    std::string keys;
    for (const Given& g : given) keys += (keys.empty() ? "" : ", ") + g.text;
    message = keys + ": each fits alone, but no plan has all of them: " + all.killer;
  }
  throw ConfigError(message);
}

}  // namespace kolos::planner
