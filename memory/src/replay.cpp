// replay(): checks a plan by acting it out. Deliberately shares nothing with
// the planners in placement.cpp (no helpers, no bookkeeping struct) so that a
// bug there cannot hide itself here.
#include <set>

#include "kolos/core/error.h"
#include "kolos/memory/placement.h"

namespace kolos::memory {

ReplayReport replay(const AccessTrace& trace, const Plan& plan) {
  if (plan.steps.size() != trace.steps.size()) {
    throw Error(detail::concat("replay: the plan has ", plan.steps.size(),
                               " steps but the trace has ", trace.steps.size()));
  }
  std::set<ChunkId> resident;
  ReplayReport report;
  int64_t bytes = 0;
  auto size_of = [&](ChunkId c, std::size_t step, const char* what) {
    if (c >= trace.chunks.size()) {
      throw Error(detail::concat("replay: step ", step, " ", what, " chunk ", c,
                                 ", which the trace does not have"));
    }
    return trace.chunks[c].bytes;
  };
  auto enter = [&](ChunkId c, std::size_t step, const char* what) {
    const int64_t size = size_of(c, step, what);
    if (!resident.insert(c).second) {
      throw Error(detail::concat("replay: step ", step, " ", what, " chunk ", c,
                                 ", which is already resident"));
    }
    bytes += size;
    report.bytes_loaded += size;
    if (bytes > plan.budget_bytes) {
      throw Error(detail::concat("replay: step ", step, " ", what, " chunk ", c, " and reaches ",
                                 bytes, " resident bytes, over the budget of ", plan.budget_bytes));
    }
    if (bytes > report.peak_resident_bytes) report.peak_resident_bytes = bytes;
  };

  const std::size_t before_start = 0;
  for (ChunkId c : plan.initial) enter(c, before_start, "(initial) holds");
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    const StepMoves& moves = plan.steps[i];
    for (ChunkId c : moves.evict) {
      const int64_t size = size_of(c, i, "evicts");
      if (resident.erase(c) == 0) {
        throw Error(
            detail::concat("replay: step ", i, " evicts chunk ", c, ", which is not resident"));
      }
      bytes -= size;
      report.bytes_evicted += size;
    }
    for (ChunkId c : moves.load) enter(c, i, "loads");
    for (ChunkId c : moves.prefetch) enter(c, i, "prefetches");
    for (ChunkId c : trace.steps[i]) {
      if (resident.count(c) == 0) {
        throw Error(detail::concat("replay: step ", i, " needs chunk ", c,
                                   ", which is not resident when the step runs"));
      }
    }
    if (moves.resident_bytes != bytes) {
      throw Error(detail::concat("replay: step ", i, " runs with ", bytes,
                                 " resident bytes but the plan says ", moves.resident_bytes));
    }
  }
  return report;
}

}  // namespace kolos::memory
