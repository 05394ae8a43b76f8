// Memory per rank: the terms of core/src/engine/memory_estimate.cpp over a
// Candidate (see cost_model.h for why it is written again here).
#include <algorithm>
#include <cmath>

#include "kolos/planner/cost_model.h"
#include "kolos/schedules/plan.h"
#include "schedule_kind.h"

namespace kolos::planner {
namespace {

// Micro-batches whose activations pipeline rank r holds at once, in units of
// its whole stage: the schedules' own count (libkolos_schedules).
double in_flight(const Candidate& c, int64_t r) {
  return pipeline::stage_activations_in_flight(
      schedule_kind(c.schedule), static_cast<int>(c.pp), static_cast<int>(c.microbatches),
      static_cast<int>(c.chunks), static_cast<int>(r));
}

bool ring_kernel(SpMode m) { return m == SpMode::kRing || m == SpMode::kHybrid; }

// Bytes autograd keeps for one micro-batch through one block (the
// estimator's block_activations).
double block_activations(const ModelShape& m, const Candidate& c, double e) {
  const double tp = static_cast<double>(c.tp), b = static_cast<double>(c.micro_batch);
  const double s = static_cast<double>(m.seq_len), tokens = s / static_cast<double>(c.sp);
  const double h = static_cast<double>(m.hidden), heads = static_cast<double>(m.heads);
  const double bsh = b * tokens * h;
  double norms = 4 * bsh;
  if (c.sp_mode == SpMode::kMegatron) norms = (norms - 2 * bsh) / tp + 2 * bsh;
  const double attention =
      ring_kernel(c.sp_mode) ? b * heads * tokens * 4 / e + 3 * bsh : b * heads * tokens * s;
  const double cut = 4 * bsh + 2 * b * tokens * static_cast<double>(m.ffn()) + attention;
  if (c.tp_mode == TpMode::k1D) return e * (norms + cut / tp);
  return e * (norms + cut) / tp;
}

struct StageMemory {
  double total = 0;
  std::vector<MemoryPart> parts;
};

StageMemory stage_memory(const Workload& w, const Candidate& c, int64_t stage,
                         double runtime_bytes) {
  const ModelShape& m = w.model;
  const double e = w.element_bytes(), tp = static_cast<double>(c.tp);
  const double N = static_cast<double>(c.dp * c.sp);  // the gradients role's group
  const double blocks = static_cast<double>(m.layers) / static_cast<double>(c.pp);
  const double block = m.block_params() / tp;
  double P = blocks * block;
  if (stage == 0) P += m.embedding_params() / tp;
  if (stage == c.pp - 1) {
    P += m.head_params() / tp;
    // The tied head's copy of the token table on a stage without the embedding.
    if (stage != 0) P += static_cast<double>(m.vocab * m.hidden) / tp;
  }
  const double masters = e < 4 ? 4 : 0;
  const double bucket = 25.0 * 1024 * 1024;
  double params = 0, grads = 0, optim = 0;
  switch (c.zero) {
    case 3:
      params = e * (P / N + 2 * block);
      grads = e * (P / N + 2 * block);
      optim = (8 + masters) * P / N;
      break;
    case 2:
      params = e * P;
      grads = e * P / N + std::min(bucket, e * P);
      optim = (8 + e + masters) * P / N;
      break;
    case 1:
      params = e * P;
      grads = e * P;
      optim = (8 + e + masters) * P / N;
      break;
    default:
      params = e * P;
      grads = e * P;
      optim = (8 + masters) * P;
  }
  // The memory role keeps (1 - offload) of the model states on the device.
  const double kept = 1 - c.offload;
  StageMemory out;
  auto add = [&](const char* name, double bytes) {
    out.parts.push_back({name, bytes});
    out.total += bytes;
  };
  add("parameters", kept * params);
  add("gradients", kept * grads);
  add("optimizer states", kept * optim);

  const double b = static_cast<double>(c.micro_batch), sp = static_cast<double>(c.sp);
  const double s = static_cast<double>(m.seq_len), h = static_cast<double>(m.hidden);
  const double heads = static_cast<double>(m.heads);
  const double flight = in_flight(c, stage);
  const double per_block = block_activations(m, c, e);
  double act = blocks * per_block * flight;
  if (c.recompute == Recompute::kFull) {
    const double input = e * b * s / sp * h / (c.tp_mode == TpMode::k1D ? 1 : tp);
    act = blocks * input * flight + per_block;
  } else if (c.recompute == Recompute::kSelective && !ring_kernel(c.sp_mode)) {
    act -= blocks * e * b * heads * s * s / tp / sp * flight;
  }
  if (stage == c.pp - 1) {
    const double per_logit = e < 4 ? 2 * e + 3 * 4 : 3 * e;
    act += per_logit * b * s / sp * static_cast<double>(m.vocab) / tp;
  }
  add("activations", act);
  const double tile = std::min(512.0, s / sp / 2);
  const double scores = ring_kernel(c.sp_mode)
                            ? 4 * 4 * b * heads / tp * tile * tile + 10 * 4 * b * s / sp * h / tp
                            : 3 * e * b * heads * s * s / tp / sp;
  const double largest = std::max({static_cast<double>(m.vocab) * h, h * m.ffn(), h * h});
  add("temporaries", scores + 2 * e * largest / tp);
  add("allocator, buffers", kAllocatorAllowance * out.total);
  add("runtime", runtime_bytes);
  return out;
}

}  // namespace

double memory_per_rank(const Workload& w, const Candidate& c, std::vector<MemoryPart>* parts,
                       double runtime_bytes) {
  StageMemory worst = stage_memory(w, c, 0, runtime_bytes);
  if (c.pp > 1) {
    StageMemory last = stage_memory(w, c, c.pp - 1, runtime_bytes);
    if (last.total > worst.total) worst = std::move(last);
  }
  if (parts != nullptr) *parts = worst.parts;
  return worst.total;
}

}  // namespace kolos::planner
