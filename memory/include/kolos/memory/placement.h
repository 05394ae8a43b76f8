// Placement planning: which chunks sit in the compute tier at each step of a
// training iteration, and which move in and out before it.
//
// The planner works on a recorded access trace: the sequence of steps of one
// iteration (a block's forward, its backward, an optimizer update), each the
// set of chunks that must be resident in the compute tier at once. From the
// trace and a byte budget it computes, before anything runs, every eviction,
// load and prefetch, so the budget can be proved never to be exceeded: the
// plan is replayed by replay() (independent code) in the tests, and a budget
// that cannot fit the largest step is refused up front with the numbers.
//
// Two policies, after Colossal-AI Gemini's:
// - plan_auto: Belady's rule. A chunk is evicted only to make room, and the
//   one chosen is the resident chunk whose next use lies farthest ahead
//   (never one the current step needs). Chunks of the next steps are
//   prefetched into free room, never by evicting anything.
// - plan_static: per kind of state (parameters, gradients, optimizer states)
//   the first chunks in model order, up to a fraction of that kind's bytes,
//   stay resident all the time; the rest are loaded before the steps that
//   need them and evicted at the first step that does not.
//
// Torch-free, and knows nothing of tiers below the compute tier: "evict"
// means leave the compute tier (written back if dirty, which the executor
// decides), "load" means enter it before the step runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kolos::memory {

enum class StateKind { kParam, kGrad, kOptim };
const char* to_string(StateKind kind);

using ChunkId = std::size_t;

struct ChunkInfo {
  int64_t bytes = 0;
  StateKind kind = StateKind::kParam;
};

// chunks[id] describes chunk `id`; ids are in model order within each kind.
// steps[i] lists the chunks step i needs resident at once (duplicates are
// ignored).
struct AccessTrace {
  std::vector<ChunkInfo> chunks;
  std::vector<std::vector<ChunkId>> steps;
};

// What happens before step i runs, in this order: `evict` leave the compute
// tier, `load` enter it (chunks step i needs that were not resident), then
// `prefetch` enter it (chunks of later steps, moved early so their transfer
// overlaps step i's compute).
struct StepMoves {
  std::vector<ChunkId> evict;
  std::vector<ChunkId> load;
  std::vector<ChunkId> prefetch;
  int64_t resident_bytes = 0;  // while step i runs
};

struct Plan {
  std::string policy;  // "auto" or "static"
  int64_t budget_bytes = 0;
  std::vector<ChunkId> initial;  // resident before step 0 (static: the pinned chunks)
  std::vector<StepMoves> steps;  // one per trace step
  int64_t peak_resident_bytes = 0;
  int64_t bytes_loaded = 0;  // initial + loads + prefetches
  int64_t bytes_evicted = 0;

  // A few lines: policy, budget, peak, bytes moved.
  std::string summary() const;
};

// The bytes step i needs resident at once (its distinct chunks).
int64_t working_set_bytes(const AccessTrace& trace, std::size_t step);

// Throws kolos::Error when the trace is malformed (a step names a chunk that
// does not exist, a chunk has no positive size) or when `budget_bytes` is
// smaller than the largest step's working set or the largest chunk; the
// message names the budget, the bytes needed and the step (or chunk).
void check_budget(const AccessTrace& trace, int64_t budget_bytes);

// Belady plan. Among chunks whose next use is equally far (never again,
// typically) the larger leaves first, then the higher id, so a plan is a
// function of its inputs. `prefetch_depth` is how many following steps' chunks may be
// prefetched into free room (0: none). With depth 1 prefetching never adds
// a byte of traffic: a chunk prefetched for step i+1 is needed by the very
// next step and so is never the one evicted before its use. Deeper
// prefetching may fetch a chunk that is evicted again before it is used.
Plan plan_auto(const AccessTrace& trace, int64_t budget_bytes, std::size_t prefetch_depth = 1);

// Fraction of each kind's bytes held in the compute tier all the time, like
// Gemini's shard and offload fractions (1 - offload fraction); in [0, 1].
struct StaticFractions {
  double param = 0.0;
  double grad = 0.0;
  double optim = 0.0;
};

// Static plan. Pins, per kind, the first chunks in model order whose bytes
// sum to at most fraction * that kind's bytes; they are the plan's
// `initial` and never move. Every other chunk is loaded before a step that
// needs it, prefetched one step ahead when room allows, and evicted at the
// first step that does not need it. Throws kolos::Error (before planning)
// on a fraction outside [0, 1], on what check_budget refuses, and when the
// pinned bytes plus a step's streamed chunks exceed the budget (naming the
// pinned bytes per kind, the step, its streamed bytes and the budget).
Plan plan_static(const AccessTrace& trace, int64_t budget_bytes, const StaticFractions& fractions);

// What replay() observed.
struct ReplayReport {
  int64_t peak_resident_bytes = 0;
  int64_t bytes_loaded = 0;
  int64_t bytes_evicted = 0;
};

// Replays `plan` against `trace` from an empty compute tier and checks it:
// every eviction names a resident chunk, every load or prefetch a chunk that
// is not resident, the resident bytes never exceed the plan's budget after
// any move, and all of a step's chunks are resident when it runs. Throws
// kolos::Error naming the step and the chunk on the first violation.
// Independent of the planners (it shares no code with them) so that it can
// check them.
ReplayReport replay(const AccessTrace& trace, const Plan& plan);

}  // namespace kolos::memory
