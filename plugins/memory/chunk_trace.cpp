// The chunks plugin's trace (chunk_trace.h).
#include "chunk_trace.h"

#include <algorithm>
#include <utility>

#include "kolos/core/error.h"

namespace kolos::chunks {

using memory::ChunkId;

ChunkTrace::ChunkTrace(TraceInputs inputs) : in_(std::move(inputs)) {
  const size_t n = in_.chunk_of.size();  // parameters
  const memory::StateKind state_of[kKinds] = {
      memory::StateKind::kParam, memory::StateKind::kGrad, memory::StateKind::kOptim,
      memory::StateKind::kOptim, memory::StateKind::kOptim};
  ids_.assign(kKinds, std::vector<ChunkId>(in_.chunks, kNoChunk));
  for (size_t kind = 0; kind < in_.kinds; ++kind) {
    for (size_t k = 0; k < in_.chunks; ++k) {
      const bool optimizer = kind == kExpAvg || kind == kExpAvgSq || kind == kMaster;
      if (optimizer && !in_.owns(k)) continue;
      ids_[kind][k] = access.chunks.size();
      kind_of.push_back(static_cast<Kind>(kind));
      index_of.push_back(k);
      access.chunks.push_back({in_.kind_bytes(kind), state_of[kind]});
    }
  }
  for (const BlockPass& pass : in_.passes) {
    for (size_t j = pass.first; j < pass.last; ++j) {
      const size_t b = pass.backward ? pass.last - 1 - (j - pass.first) : j;
      const TraceStep::Type type = !pass.backward    ? TraceStep::kForward
                                   : pass.input_only ? TraceStep::kBackwardInput
                                                     : TraceStep::kBackward;
      steps.push_back({type, b});
      access.steps.push_back(chunks_of(in_.uses[b], type == TraceStep::kBackward
                                                        ? std::initializer_list<Kind>{kParam, kGrad}
                                                        : std::initializer_list<Kind>{kParam}));
    }
  }
  tied = in_.tied;
  if (!tied.empty()) {
    tied_step = steps.size();
    steps.push_back({TraceStep::kTied, 0});
    access.steps.push_back(chunks_of(tied, {kGrad}));
  }
  optimizer_begin = steps.size();
  for (size_t k = 0; k < in_.chunks; ++k) {
    steps.push_back({TraceStep::kOptimizer, k});
    access.steps.emplace_back();
    // ZeRO-1/2: another rank's chunk k: this one receives its parameters.
    // ZeRO-3: nothing of it stays here.
    if (in_.keeps_params(k)) access.steps.back().push_back(id(kParam, k));
    if (!in_.owns(k)) continue;
    for (Kind kind : {kGrad, kExpAvg, kExpAvgSq, kMaster}) {
      if (kind < in_.kinds) access.steps.back().push_back(id(kind, k));
    }
  }
  // A gradient chunk is zeroed where the iteration first uses it.
  zero_at.assign(steps.size(), {});
  std::vector<bool> seen(in_.chunks, false);
  for (size_t s = 0; s < steps.size(); ++s) {
    for (ChunkId c : access.steps[s]) {
      if (kind_of[c] != kGrad || seen[index_of[c]]) continue;
      seen[index_of[c]] = true;
      zero_at[s].push_back(c);
    }
  }
  // A gradient is final after the last backward step that reads its
  // parameter; its norm is taken there, while its chunk is resident. A
  // parameter no block reads has a zero gradient.
  norm_at.assign(steps.size(), {});
  std::vector<bool> done(n, false);
  for (size_t s = optimizer_begin; s-- > 0;) {
    if (steps[s].type != TraceStep::kBackward) continue;
    for (size_t i : in_.uses[steps[s].index]) {
      if (done[i]) continue;
      done[i] = true;
      norm_at[s].push_back(i);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!done[i]) unused.push_back(i);
  }
  is_tied.assign(n, false);
  for (size_t i : tied) {
    KOLOS_CHECK(done[i], "chunks: tied weight ", in_.names[i], " is read by no block of this stage");
    is_tied[i] = true;
  }
  // Norms every rank takes itself, whatever the ZeRO stage.
  norm_everywhere = is_tied;
  for (size_t i : unused) norm_everywhere[i] = true;
  block_steps_ = access.steps;
  // ZeRO-3: a parameter chunk is gathered from its owner where a block step
  // needs it and the step before did not (it stays resident between two
  // steps that both need it). The block steps are the same on every rank
  // of the group, so the broadcasts come in the same order on all.
  gather_at.assign(steps.size(), {});
  for (size_t s = 0; s < optimizer_begin; ++s) {
    for (ChunkId c : access.steps[s]) {
      if (kind_of[c] != kParam || !in_.gathered(index_of[c])) continue;
      const bool before = s > 0 && std::find(access.steps[s - 1].begin(), access.steps[s - 1].end(),
                                             c) != access.steps[s - 1].end();
      if (!before) gather_at[s].push_back(c);
    }
  }
  overlap.assign(steps.size(), false);
  ahead.assign(steps.size(), false);
}

void ChunkTrace::augment(bool reductions, bool gathers, int64_t budget) {
  access.steps = block_steps_;
  overlap.assign(steps.size(), false);
  ahead.assign(steps.size(), false);
  const size_t blocks_end = tied_step == kNoStep ? optimizer_begin : tied_step;
  const auto add = [&](size_t s, const std::vector<ChunkId>& chunks) {
    std::vector<ChunkId>& step = access.steps[s];
    const std::vector<ChunkId> alone = step;
    step.insert(step.end(), chunks.begin(), chunks.end());
    std::sort(step.begin(), step.end());
    step.erase(std::unique(step.begin(), step.end()), step.end());
    if (memory::working_set_bytes(access, s) <= budget) return true;
    step = alone;
    return false;
  };
  if (reductions) {
    for (size_t s = 0; s + 1 < blocks_end; ++s) {
      std::vector<ChunkId> grads;
      for (size_t i : norm_at[s]) {
        const size_t k = in_.chunk_of[i];
        if (in_.reduced(k)) grads.push_back(id(kGrad, k));
      }
      if (!grads.empty()) overlap[s] = add(s + 1, grads);
    }
  }
  if (gathers) {
    for (size_t s = 1; s < blocks_end; ++s) {
      if (!gather_at[s].empty()) ahead[s] = add(s - 1, gather_at[s]);
    }
  }
}

ChunkId ChunkTrace::id(Kind kind, size_t k) const {
  KOLOS_CHECK(has(kind, k), "internal error: no chunk ", k, " of kind ", kind, " here");
  return ids_[kind][k];
}

std::vector<ChunkId> ChunkTrace::chunks_of(const std::vector<size_t>& params,
                                           std::initializer_list<Kind> kinds) const {
  std::vector<ChunkId> out;
  for (Kind kind : kinds) {
    for (size_t i : params) out.push_back(id(kind, in_.chunk_of[i]));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace kolos::chunks
