// One way to run a workload on N ranks (Candidate), and what the cost model
// predicts for it (Prediction).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolos::planner {

enum class Schedule { kNone, kGPipe, k1F1B, kInterleaved, kZeroBubble };
enum class Recompute { kNone, kSelective, kFull };

const char* to_string(Schedule kind);   // "-", "gpipe", "1f1b", "interleaved", "zb"
const char* to_string(Recompute kind);  // "none", "selective", "full"

// Mesh sizes follow kolos's mesh: pp, dp, sp, tp outermost first, and rank
// ((p·DP + d)·SP + s)·TP + t. The tensor and sequence layouts are what the
// layers' and sequence plugins offer (PluginTerms::layouts), in their
// sections' words; a sequence plugin that splits over the tensor group
// (sequence_over_tensor, kolos/core/sequence_modes.h) runs with sp = 1.
struct Candidate {
  int64_t pp = 1, dp = 1, sp = 1, tp = 1;
  std::string tp_mode = "1d";  // [parallel.tensor] mode
  int64_t tp_depth = 1;        // [parallel.tensor] depth (2.5d's d of d·q·q)
  std::string sp_mode;         // [parallel.sequence] mode; "" none
  int64_t ulysses = 1;         // [parallel.sequence] ulysses (hybrid's a of sp = a·r)
  Schedule schedule = Schedule::kNone;
  int64_t microbatches = 1;  // M per step and dp rank
  int64_t chunks = 1;        // V, interleaved only
  int zero = 0;              // ZeRO stage 0-3 (0: plain dp)
  double offload = 0;        // the memory role: fraction of model states kept off the device
  Recompute recompute = Recompute::kNone;
  int64_t micro_batch = 1;  // sequences per micro-batch

  int64_t ranks() const { return pp * dp * sp * tp; }
  // "pp 8 dp 16 tp 8(1d) 1f1b M=96 mb 1 zero1 full"
  std::string describe() const;
  // The mesh and its modes, without the schedule, micro-batching, ZeRO
  // stage, recomputation or offload: "pp 8 dp 16 sp 1 tp 8(1d)". Plans of
  // one layout share most of their work and most of a prediction's error.
  std::string layout() const;
};

struct MemoryPart {
  std::string name;
  double bytes = 0;
};

struct Prediction {
  // Seconds per optimizer step. step = compute + comm + bubble + optimizer + offload.
  double step = 0;
  double compute = 0;  // the busiest stage's arithmetic
  double comm =
      0;  // exposed communication: tp, sp, dp/ZeRO not hidden, pp transfers on the critical path
  double bubble = 0;     // pipeline idle time of the busiest stage
  double optimizer = 0;  // AdamW and the gradient norm
  double offload = 0;    // host transfers and the host optimizer not hidden
  // Bytes per rank at the peak, worst stage.
  double memory = 0;
  std::vector<MemoryPart> memory_parts;
  // Bytes one rank sends per step, and by axis.
  double bytes_sent = 0;
  double bytes_tp = 0, bytes_sp = 0, bytes_dp = 0, bytes_pp = 0;
  // Groups (tp, sp, dp x sp, pp) whose ranks span more than one node.
  int crossing_groups = 0;
  // The model FLOPs of a step as Narayanan et al. count them, per GPU per second.
  double model_flops_per_gpu = 0;
  // The factor this host's measured finalists of the plan's family applied
  // to step (1: none; tune.h), and the step's relative uncertainty (one
  // standard deviation of ln measured/predicted).
  double feedback = 1;
  double uncertainty = 0;
  // A chosen plugin that says nothing of what it sends (no traffic hook in
  // its terms): named here, its collectives left out of `comm`.
  std::vector<std::string> unpriced;
};

}  // namespace kolos::planner
