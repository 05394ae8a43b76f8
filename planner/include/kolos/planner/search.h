// The search: every valid Candidate for N ranks, pruned by memory first,
// ranked by predicted step time.
//
// Enumeration: pp x dp x sp x tp = N; the tensor and sequence layouts the
// layers' and sequence plugins offer for tp and sp (PluginTerms::layouts;
// the shipped ones: tp 1d, 2d, 2.5d, 3d; sp ulysses, ring, hybrid, and
// megatron over a 1d tensor group with sp = 1), whose rules on the model
// (layout_problem) drop the rest; pipeline schedules gpipe, 1f1b,
// interleaved (chunks 2, 4, ...), zb; ZeRO 0-3;
// recompute none/selective/full; the micro-batch sizes in options; the
// offload fractions in options. A candidate is dropped at the first
// constraint it breaks, and the drop is counted by reason (structure first,
// memory last, so the memory count is of candidates that could run but do
// not fit). The survivors are ranked in two passes: all by the closed-form
// bubble, then the best `refine` by simulating their pipeline schedule.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kolos/planner/candidate.h"
#include "kolos/planner/cost_model.h"

namespace kolos::planner {

// Sizes a user fixed (parallel.auto = true with some sizes given): only
// candidates that match every given field are considered.
struct Fixed {
  std::optional<int64_t> pp, dp, sp, tp, zero, micro_batch;
  std::optional<std::string> tp_mode, sp_mode, schedule, recompute;
};

struct SearchOptions {
  int64_t ranks = 0;  // N; 0: every device of the cluster
  std::vector<int64_t> micro_batches = {1, 2, 4, 8};
  std::vector<double> offload_fractions = {0.0, 0.5, 1.0};
  int64_t max_chunks = 4;  // interleaved: V = 2, 4, ... up to this
  size_t top = 10;         // plans kept
  // Besides the top: the best plan of each layout (Candidate::layout) that
  // has none among them, at most this many, so that the finalists can reach
  // a layout whose variants the cost model ranks just below another's.
  size_t layouts = 8;
  size_t refine = 200;     // survivors re-ranked by simulating their schedule
  Fixed fixed;
  // Optional: the caller's check of a surviving plan, called fastest first
  // after the simulation until `top` plans pass; returns "" to accept, or
  // the reason it refuses (counted with the drops). It may amend the
  // prediction (kolos replaces the memory with its own estimate).
  std::function<std::string(const Candidate&, Prediction&)> accept;
};

struct RankedPlan {
  Candidate candidate;
  Prediction prediction;
};

struct SearchResult {
  // Best first: the `top` best, then the best of each other layout (at most
  // options.layouts), each after the plans before it.
  std::vector<RankedPlan> plans;
  size_t top = 0;                          // how many of plans are the top
  int64_t evaluated = 0;                   // candidates enumerated
  int64_t survived = 0;                    // candidates that fit
  std::map<std::string, int64_t> dropped;  // reason -> count
  // When nothing survives: the constraint that removed the last candidates
  // that passed every earlier one, with the closest of them.
  std::string killer;
  double seconds = 0;  // wall time of the search
};

SearchResult search(const Workload& w, const Machine& m, const SearchOptions& options);

// The top plans as a table, then the drop reasons with their counts (and,
// when none survived, the killer).
std::string format_plans(const SearchResult& result, const Workload& w, const Machine& m);

// For parallel.auto = true with some sizes given: throws ConfigError naming
// each given key ("parallel.tensor.size = 3") that no valid candidate
// satisfies (and why the candidates with it were dropped), or all of them
// when each alone is satisfiable but not together. Returns the search result
// under all the fixed sizes when it has a plan.
SearchResult check_fixed(const Workload& w, const Machine& m, const SearchOptions& options);

}  // namespace kolos::planner
