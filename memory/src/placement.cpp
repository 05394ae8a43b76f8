#include "kolos/memory/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "kolos/core/error.h"

namespace kolos::memory {
namespace {

constexpr std::size_t kNever = std::numeric_limits<std::size_t>::max();

void check_trace(const AccessTrace& trace) {
  for (std::size_t c = 0; c < trace.chunks.size(); ++c) {
    if (trace.chunks[c].bytes <= 0) {
      throw Error(detail::concat("placement: chunk ", c, " has ", trace.chunks[c].bytes,
                                 " bytes; every chunk must have a positive size"));
    }
  }
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    for (ChunkId c : trace.steps[i]) {
      if (c >= trace.chunks.size()) {
        throw Error(detail::concat("placement: step ", i, " needs chunk ", c, " but the trace has ",
                                   trace.chunks.size(), " chunks (ids 0..",
                                   trace.chunks.size() == 0 ? 0 : trace.chunks.size() - 1, ")"));
      }
    }
  }
}

// Step i's chunks without duplicates, in the order first listed.
std::vector<ChunkId> distinct(const std::vector<ChunkId>& step, std::vector<char>& seen) {
  std::vector<ChunkId> out;
  for (ChunkId c : step) {
    if (!seen[c]) {
      seen[c] = 1;
      out.push_back(c);
    }
  }
  for (ChunkId c : out) seen[c] = 0;
  return out;
}

// Residency bookkeeping shared by both planners.
struct Tier {
  const AccessTrace& trace;
  Plan& plan;
  std::vector<char> resident;
  int64_t bytes = 0;

  Tier(const AccessTrace& t, Plan& p) : trace(t), plan(p), resident(t.chunks.size(), 0) {}

  void bring(ChunkId c, std::vector<ChunkId>& into) {
    resident[c] = 1;
    bytes += trace.chunks[c].bytes;
    plan.bytes_loaded += trace.chunks[c].bytes;
    into.push_back(c);
  }
  void drop(ChunkId c, std::vector<ChunkId>& into) {
    resident[c] = 0;
    bytes -= trace.chunks[c].bytes;
    plan.bytes_evicted += trace.chunks[c].bytes;
    into.push_back(c);
  }
  void ran(StepMoves& moves) {
    moves.resident_bytes = bytes;
    plan.peak_resident_bytes = std::max(plan.peak_resident_bytes, bytes);
  }
};

std::string human(int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%lld B (%.2f MiB)", static_cast<long long>(bytes),
                static_cast<double>(bytes) / 1048576.0);
  return text;
}

}  // namespace

const char* to_string(StateKind kind) {
  switch (kind) {
    case StateKind::kParam:
      return "parameters";
    case StateKind::kGrad:
      return "gradients";
    case StateKind::kOptim:
      return "optimizer states";
  }
  return "?";
}

std::string Plan::summary() const {
  std::size_t moves = 0;
  for (const StepMoves& s : steps) moves += s.evict.size() + s.load.size() + s.prefetch.size();
  return detail::concat("placement ", policy, ": budget ", human(budget_bytes), ", peak resident ",
                        human(peak_resident_bytes), ", ", steps.size(), " steps, ", moves,
                        " moves; loaded ", human(bytes_loaded), ", evicted ", human(bytes_evicted));
}

int64_t working_set_bytes(const AccessTrace& trace, std::size_t step) {
  std::vector<char> seen(trace.chunks.size(), 0);
  int64_t sum = 0;
  for (ChunkId c : distinct(trace.steps.at(step), seen)) sum += trace.chunks.at(c).bytes;
  return sum;
}

void check_budget(const AccessTrace& trace, int64_t budget_bytes) {
  check_trace(trace);
  std::size_t widest = 0;
  int64_t widest_bytes = 0;
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    const int64_t bytes = working_set_bytes(trace, i);
    if (bytes > widest_bytes) {
      widest = i;
      widest_bytes = bytes;
    }
  }
  if (widest_bytes > budget_bytes) {
    throw Error(detail::concat(
        "placement: the compute budget of ", budget_bytes, " bytes is smaller than step ", widest,
        "'s working set of ", widest_bytes, " bytes (", trace.steps[widest].size(),
        " chunks that must be resident at once); raise the budget to at least ", widest_bytes,
        " bytes or use smaller chunks"));
  }
  std::size_t largest = 0;
  for (std::size_t c = 0; c < trace.chunks.size(); ++c) {
    if (trace.chunks[c].bytes > trace.chunks[largest].bytes) largest = c;
  }
  if (!trace.chunks.empty() && trace.chunks[largest].bytes > budget_bytes) {
    throw Error(detail::concat(
        "placement: the compute budget of ", budget_bytes, " bytes is smaller than chunk ", largest,
        " (", to_string(trace.chunks[largest].kind), ") of ", trace.chunks[largest].bytes,
        " bytes; raise the budget or use smaller chunks"));
  }
}

Plan plan_auto(const AccessTrace& trace, int64_t budget_bytes, std::size_t prefetch_depth) {
  check_budget(trace, budget_bytes);
  const std::size_t n = trace.chunks.size();
  std::vector<char> seen(n, 0);
  std::vector<std::vector<ChunkId>> steps;
  steps.reserve(trace.steps.size());
  for (const auto& step : trace.steps) steps.push_back(distinct(step, seen));

  // uses[c]: the steps that need chunk c, ascending; cursor[c] walks it.
  std::vector<std::vector<std::size_t>> uses(n);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    for (ChunkId c : steps[i]) uses[c].push_back(i);
  }
  std::vector<std::size_t> cursor(n, 0);
  auto next_use_after = [&](ChunkId c, std::size_t i) {
    while (cursor[c] < uses[c].size() && uses[c][cursor[c]] <= i) ++cursor[c];
    return cursor[c] < uses[c].size() ? uses[c][cursor[c]] : kNever;
  };

  Plan plan;
  plan.policy = "auto";
  plan.budget_bytes = budget_bytes;
  plan.steps.resize(steps.size());
  Tier tier(trace, plan);
  std::vector<char> needed(n, 0);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    StepMoves& moves = plan.steps[i];
    int64_t missing = 0;
    for (ChunkId c : steps[i]) {
      needed[c] = 1;
      if (!tier.resident[c]) missing += trace.chunks[c].bytes;
    }
    // Make room by Belady's rule: the resident chunk used farthest ahead
    // (never again first), then the larger, then the higher id, so that the
    // plan is deterministic.
    while (tier.bytes + missing > budget_bytes) {
      ChunkId victim = kNever;
      std::size_t victim_next = 0;
      for (ChunkId c = 0; c < n; ++c) {
        if (!tier.resident[c] || needed[c]) continue;
        const std::size_t next = next_use_after(c, i);
        if (victim == kNever || next > victim_next ||
            (next == victim_next && trace.chunks[c].bytes >= trace.chunks[victim].bytes)) {
          victim = c;
          victim_next = next;
        }
      }
      // check_budget guarantees the working set fits, so a victim exists.
      KOLOS_CHECK(victim != kNever, "placement: no chunk to evict at step ", i);
      tier.drop(victim, moves.evict);
    }
    for (ChunkId c : steps[i]) {
      if (!tier.resident[c]) tier.bring(c, moves.load);
    }
    // Prefetch into free room only: evicting for a prefetch could throw out
    // a chunk needed sooner than the one fetched.
    for (std::size_t j = i + 1; j < steps.size() && j - i <= prefetch_depth; ++j) {
      for (ChunkId c : steps[j]) {
        if (!tier.resident[c] && tier.bytes + trace.chunks[c].bytes <= budget_bytes) {
          tier.bring(c, moves.prefetch);
        }
      }
    }
    for (ChunkId c : steps[i]) needed[c] = 0;
    tier.ran(moves);
  }
  return plan;
}

Plan plan_static(const AccessTrace& trace, int64_t budget_bytes, const StaticFractions& fractions) {
  const double per_kind[3] = {fractions.param, fractions.grad, fractions.optim};
  for (int k = 0; k < 3; ++k) {
    if (!(per_kind[k] >= 0.0 && per_kind[k] <= 1.0)) {
      throw Error(detail::concat("placement static: the fraction of ",
                                 to_string(static_cast<StateKind>(k)), " held resident is ",
                                 per_kind[k], "; it must be in [0, 1]"));
    }
  }
  check_budget(trace, budget_bytes);
  const std::size_t n = trace.chunks.size();

  // Pin the first chunks of each kind, in model (id) order.
  int64_t kind_total[3] = {0, 0, 0};
  for (const ChunkInfo& c : trace.chunks) kind_total[static_cast<int>(c.kind)] += c.bytes;
  int64_t kind_pinned[3] = {0, 0, 0};
  bool kind_full[3] = {false, false, false};
  std::vector<char> pinned(n, 0);
  for (ChunkId c = 0; c < n; ++c) {
    const int k = static_cast<int>(trace.chunks[c].kind);
    const auto limit =
        static_cast<int64_t>(std::floor(per_kind[k] * static_cast<double>(kind_total[k])));
    // The first chunk that does not fit ends the kind's pinned prefix.
    if (kind_full[k] || kind_pinned[k] + trace.chunks[c].bytes > limit) {
      kind_full[k] = true;
      continue;
    }
    pinned[c] = 1;
    kind_pinned[k] += trace.chunks[c].bytes;
  }
  const int64_t pinned_bytes = kind_pinned[0] + kind_pinned[1] + kind_pinned[2];

  std::vector<char> seen(n, 0);
  std::vector<std::vector<ChunkId>> streamed(trace.steps.size());
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    int64_t bytes = 0;
    for (ChunkId c : distinct(trace.steps[i], seen)) {
      if (pinned[c]) continue;
      streamed[i].push_back(c);
      bytes += trace.chunks[c].bytes;
    }
    if (pinned_bytes + bytes > budget_bytes) {
      throw Error(detail::concat(
          "placement static: ", pinned_bytes, " bytes pinned (parameters ", kind_pinned[0],
          ", gradients ", kind_pinned[1], ", optimizer states ", kind_pinned[2], ") plus the ",
          bytes, " bytes step ", i, " streams in make ", pinned_bytes + bytes,
          " bytes, more than the compute budget of ", budget_bytes,
          " bytes; lower the fractions by at least ", pinned_bytes + bytes - budget_bytes,
          " bytes' worth or raise the budget"));
    }
  }
  if (pinned_bytes > budget_bytes) {  // no steps at all
    throw Error(detail::concat("placement static: ", pinned_bytes,
                               " bytes pinned exceed the compute budget of ", budget_bytes,
                               " bytes"));
  }

  Plan plan;
  plan.policy = "static";
  plan.budget_bytes = budget_bytes;
  plan.steps.resize(trace.steps.size());
  Tier tier(trace, plan);
  for (ChunkId c = 0; c < n; ++c) {
    if (pinned[c]) tier.bring(c, plan.initial);
  }
  plan.peak_resident_bytes = tier.bytes;
  std::vector<char> needed(n, 0);
  for (std::size_t i = 0; i < streamed.size(); ++i) {
    StepMoves& moves = plan.steps[i];
    for (ChunkId c : streamed[i]) needed[c] = 1;
    for (ChunkId c = 0; c < n; ++c) {
      if (tier.resident[c] && !pinned[c] && !needed[c]) tier.drop(c, moves.evict);
    }
    for (ChunkId c : streamed[i]) {
      if (!tier.resident[c]) tier.bring(c, moves.load);
    }
    // One step ahead, into free room: the next step needs these, so its
    // evictions never touch them.
    if (i + 1 < streamed.size()) {
      for (ChunkId c : streamed[i + 1]) {
        if (!tier.resident[c] && tier.bytes + trace.chunks[c].bytes <= budget_bytes) {
          tier.bring(c, moves.prefetch);
        }
      }
    }
    for (ChunkId c : streamed[i]) needed[c] = 0;
    tier.ran(moves);
  }
  return plan;
}

}  // namespace kolos::memory
