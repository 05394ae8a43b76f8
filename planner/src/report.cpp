// Names, one-line descriptions and the plan table.
#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "kolos/planner/search.h"
#include "schedule_kind.h"

namespace kolos::planner {

const char* to_string(Schedule kind) {
  // The schedules library's names (kolos/schedules/plan.h).
  return kind == Schedule::kNone ? "-" : pipeline::to_string(schedule_kind(kind));
}

const char* to_string(Recompute kind) {
  switch (kind) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

namespace {

std::string tp_text(const Candidate& c) {
  std::string out = std::to_string(c.tp);
  if (c.tp > 1) {
    out += "(" + c.tp_mode;
    if (c.tp_depth > 1) out += " d" + std::to_string(c.tp_depth);
    out += ")";
  }
  return out;
}

std::string sp_text(const Candidate& c) {
  if (c.sp_mode.empty()) return std::to_string(c.sp);
  std::string out = std::to_string(c.sp) + "(" + c.sp_mode;
  if (c.ulysses > 1) out += " a" + std::to_string(c.ulysses);
  return out + ")";
}

std::string schedule_text(const Candidate& c) {
  if (c.pp <= 1) return "-";
  std::string out = to_string(c.schedule);
  if (c.schedule == Schedule::kInterleaved) out += " V" + std::to_string(c.chunks);
  return out;
}

std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

}  // namespace

std::string Candidate::describe() const {
  std::ostringstream out;
  out << layout();
  if (pp > 1) out << " " << schedule_text(*this);
  out << " M=" << microbatches << " mb " << micro_batch << " zero" << zero << " "
      << to_string(recompute);
  if (offload > 0) out << " offload " << fixed(offload, 2);
  return out.str();
}

std::string Candidate::layout() const {
  std::ostringstream out;
  out << "pp " << pp << " dp " << dp << " sp " << sp_text(*this) << " tp " << tp_text(*this);
  return out.str();
}

std::string format_plans(const SearchResult& r, const Workload& w, const Machine& m) {
  std::ostringstream out;
  const double gib = 1024.0 * 1024 * 1024;
  const double params = w.model.total_params();
  out << "Plans for " << w.model.name << " ("
      << (params >= 1e9 ? fixed(params / 1e9, 1) + "B" : fixed(params / 1e6, 1) + "M")
      << " parameters, batch " << w.global_batch << ", seq " << w.model.seq_len << ", "
      << w.precision << ") on " << m.cluster.name << "; rates: " << m.rates.source << "\n\n";
  // Below a TFLOP/s (a CPU), throughput in GFLOP/s per rank.
  bool small = false;
  for (const RankedPlan& p : r.plans) small = small || p.prediction.model_flops_per_gpu < 1e12;
  if (!r.plans.empty()) {
    out << "| # | pp | dp | sp | tp | schedule | M | mb | zero | recompute | offload | step s | "
           "compute | comm | bubble | optim | memory GiB | GB sent | "
        << (small ? "GFLOP/s/rank" : "TFLOP/s/GPU") << " |\n";
    out << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    int i = 0;
    for (const RankedPlan& p : r.plans) {
      const Candidate& c = p.candidate;
      const Prediction& q = p.prediction;
      out << "| " << ++i << " | " << c.pp << " | " << c.dp << " | " << sp_text(c) << " | "
          << tp_text(c) << " | " << schedule_text(c) << " | " << c.microbatches << " | "
          << c.micro_batch << " | " << c.zero << " | " << to_string(c.recompute) << " | "
          << fixed(c.offload, 2) << " | " << fixed(q.step, 3) << " | " << fixed(q.compute, 3)
          << " | " << fixed(q.comm, 3) << " | " << fixed(q.bubble, 3) << " | "
          << fixed(q.optimizer + q.offload, 3) << " | " << fixed(q.memory / gib, 1) << " | "
          << fixed(q.bytes_sent / 1e9, 2) << " | "
          << (small ? fixed(q.model_flops_per_gpu / 1e9, 1)
                    : fixed(q.model_flops_per_gpu / 1e12, 1))
          << " |\n";
    }
    std::set<std::string> unpriced;
    for (const RankedPlan& p : r.plans)
      unpriced.insert(p.prediction.unpriced.begin(), p.prediction.unpriced.end());
    for (const std::string& u : unpriced) out << "\nNot priced: " << u << ".";
    if (!unpriced.empty()) out << "\n";
    if (r.top < r.plans.size()) {
      out << "\nRows " << r.top + 1 << "-" << r.plans.size()
          << ": the best plan of each other layout (pp, dp, sp and tp with their modes).\n";
    }
    out << "\n";
  }
  out << r.evaluated << " candidates evaluated, " << r.survived << " fit, in "
      << fixed(r.seconds, 2) << " s.\n";
  std::vector<std::pair<std::string, int64_t>> reasons(r.dropped.begin(), r.dropped.end());
  std::sort(reasons.begin(), reasons.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  if (!reasons.empty()) out << "Dropped:\n";
  for (const auto& [reason, count] : reasons) out << "  " << count << "  " << reason << "\n";
  if (r.plans.empty()) out << "No plan: " << r.killer << "\n";
  return out.str();
}

}  // namespace kolos::planner
