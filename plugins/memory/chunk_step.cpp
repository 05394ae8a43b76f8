// The chunks plugin (chunked_memory.h): one iteration of ChunkedMemory.
// The trace's steps in order (the block hooks' forward and backward steps,
// then the optimizer's chunk steps), each binding the model's tensors to
// its chunks and running ZeRO-3's gathers; the gradients' reductions over
// their domains as steps end, and their norms and finiteness; the
// optimizer step over the chunks; and the step's communication statistics.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "kolos/core/error.h"

#include "chunk_fault.h"
#include "chunked_memory.h"

namespace kolos::chunks {

using memory::ChunkId;

// ---- one step -----------------------------------------------------------

ReductionStats ChunkedMemory::reduction_stats() const {
  // bytes: the gradients' reductions (ZeRO's parameter broadcasts are
  // not reductions); bytes_during_backward: those that ran while the
  // next block step computed.
  ReductionStats stats;
  stats.bytes = reduced_bytes_;
  stats.bytes_during_backward = overlapped_bytes_;
  stats.reductions = reductions_;
  stats.completed_before_finish = completed_before_finish_;
  stats.wait_s = finish_wait_s_;
  return stats;
}

GatherStats ChunkedMemory::gather_stats() const {
  GatherStats stats;
  stats.bytes = gathered_bytes_;
  stats.bytes_ahead = gathered_ahead_bytes_;
  stats.wait_s = gather_wait_s_;
  return stats;
}

void ChunkedMemory::zero_grad() {
  gathered_bytes_ = 0;
  gathered_ahead_bytes_ = 0;
  gather_wait_s_ = 0;
  reduced_bytes_ = 0;
  reductions_ = 0;
  overlapped_bytes_ = 0;
  completed_before_finish_ = 0;
  finish_wait_s_ = 0;
  finish_skipped_step();
  KOLOS_CHECK(cursor_ == 0, name(), ": a step began at trace step ", cursor_, " of ",
              t_.steps.size(), " (the previous step did not finish)");
  materialized_.clear();  // copies made for a checkpoint
  std::fill(norms_.begin(), norms_.end(), at::Tensor());
  std::fill(finite_.begin(), finite_.end(), true);
  tied_done_ = false;
  norms_shared_ = false;
  unscale_.reset();
  scales_.clear();
}

// A step whose backward ended but whose optimizer step the engine skipped
// (fp16's loss scaler found an overflow): the optimizer's trace steps run
// all the same, since the plan expects them (what is resident where), but
// nothing is updated or marked changed.
void ChunkedMemory::finish_skipped_step() {
  if (cursor_ != t_.optimizer_begin) return;
  for (size_t k = 0; k < num_chunks_; ++k) begin(t_.optimizer_begin + k);
  end_current_step();
  scales_.clear();
  cursor_ = 0;
}

void ChunkedMemory::finish_backward() {
  // The last backward step ends here: its gradients' reductions and norms.
  const auto start = std::chrono::steady_clock::now();
  finish_reductions();  // the step before's
  finishing_ = true;
  end_current_step();
  finish_reductions();
  finishing_ = false;
  finish_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i : t_.unused) norms_[i] = torch::zeros({}, dtype_);
  if (t_.tied_step != ChunkTrace::kNoStep) begin(t_.tied_step);
  KOLOS_CHECK(cursor_ == t_.optimizer_begin, name(), ": backward ended at trace step ", cursor_,
              ", expected ", t_.optimizer_begin,
              " (the blocks did not run in the order the trace was made for)");
}

// Under pipelining, the tied weights' gradients (resident in the tied
// step): the pipeline sums them over their holders in place; their norms
// are taken after (tied_norms). Every other gradient is final already.
std::vector<GradPiece> ChunkedMemory::grad_pieces() {
  std::vector<GradPiece> pieces;
  if (t_.tied_step == ChunkTrace::kNoStep || current_ != t_.tied_step) return pieces;
  for (size_t i : t_.tied)
    pieces.push_back(GradPiece{params_[i].tensor.grad(), params_[i].placement});
  return pieces;
}

bool ChunkedMemory::gradients_finite(const std::vector<GradPiece>&) {
  tied_norms();
  share_norms();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!finite_[i]) return false;
  }
  return true;
}

double ChunkedMemory::gradient_norm(const std::vector<GradPiece>&, const DeviceMesh& mesh) {
  tied_norms();
  share_norms();
  // global_grad_norm()'s arithmetic on the norms taken where each
  // gradient became final: replicated pieces counted once, sharded ones
  // (tensor parallelism) summed over their group.
  std::vector<at::Tensor> norms;
  std::vector<Placement> placements;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].tensor.numel() == 0) continue;
    KOLOS_CHECK(norms_[i].defined(), "internal error: no gradient norm for ", params_[i].name);
    norms.push_back(norms_[i]);
    placements.push_back(params_[i].placement);
  }
  return global_grad_norm(norms, placements, mesh);
}

void ChunkedMemory::step(double lr) {
  torch::NoGradGuard no_grad;
  const int64_t t = optimizer_->step_count() + 1;
  for (size_t k = 0; k < num_chunks_; ++k) {
    maybe_die_mid_step(t, k, num_chunks_);
    begin(t_.optimizer_begin + k);
    if (owns(k)) {
      const auto [first, last] = chunk_params_[k];
      for (size_t i = first; i < last; ++i) {
        for (double f : scales_) params_[i].tensor.mutable_grad().mul_(f);
      }
      optimizer_->update(lr, first, last, t);
      for (Kind kind : {kExpAvg, kExpAvgSq, kMaster}) {
        if (kind < kinds_) executor_->mark_dirty(id(kind, k));
      }
    }
    if (shards(k) > 1 && zero_stage_ < 3) {
      // ZeRO-1/2: the chunk's owner stepped it; every rank takes its
      // parameters (the whole chunk, padding and all). Under ZeRO-3 the
      // owner alone keeps them; the others gather them where used.
      broadcast_from_owner(id(kParam, k))->wait();
    }
    if (holds(kParam, k)) executor_->mark_dirty(id(kParam, k));
  }
  end_current_step();
  optimizer_->set_step_count(t);
  scales_.clear();
  KOLOS_CHECK(cursor_ == t_.steps.size(), "internal error: step ended at trace step ", cursor_);
  cursor_ = 0;
}

// Launches the broadcast of chunk c (resident) from its index's owner to
// every other rank of the group; c must stay resident until it completes.
// Not a reduction: not in reduction_stats().
comm::WorkPtr ChunkedMemory::broadcast_from_owner(ChunkId c) {
  at::Tensor bytes = at::from_blob(executor_->chunk(c), {kind_bytes(t_.kind_of[c])},
                                   at::TensorOptions().dtype(at::kByte));
  return domain(t_.index_of[c]).group->broadcast(bytes, owner(t_.index_of[c]));
}

// ---- the trace ----------------------------------------------------------------

at::Tensor& ChunkedMemory::tensor_of(size_t kind, size_t i) {
  AdamWSlot& slot = optimizer_->slots()[i];
  switch (kind) {
    case kParam:
      return slot.param;
    case kGrad:
      return slot.grad;
    case kExpAvg:
      return slot.exp_avg;
    case kExpAvgSq:
      return slot.exp_avg_sq;
    default:
      return slot.master;
  }
}

// Points every tensor of chunk `c` into `base` (nullptr: no memory).
void ChunkedMemory::bind(ChunkId c, std::byte* base) {
  const size_t kind = t_.kind_of[c];
  const auto [first, last] = chunk_params_[t_.index_of[c]];
  for (size_t i = first; i < last; ++i) {
    c10::StorageImpl* s = tensor_of(kind, i).storage().unsafeGetStorageImpl();
    if (base == nullptr) {
      s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
      s->set_nbytes(0);
    } else {
      s->set_data_ptr_noswap(at::DataPtr(base + slot_offset(kind, i), s->device()));
      s->set_nbytes(static_cast<size_t>(slot_bytes(kind, i)));
    }
  }
  bound_[c] = base != nullptr;
}

// The hooks' way in: the next trace step must be `expected` (a backward
// hook stands for either kind of backward step).
void ChunkedMemory::advance(TraceStep expected) {
  const char* names[] = {"forward", "backward", "backward (input)", "tied gradients", "optimizer"};
  const bool matches = cursor_ < t_.optimizer_begin && t_.steps[cursor_].index == expected.index &&
                       (t_.steps[cursor_].type == expected.type ||
                        (expected.type == TraceStep::kBackward &&
                         t_.steps[cursor_].type == TraceStep::kBackwardInput));
  KOLOS_CHECK(matches, name(), ": the ", names[expected.type], " of block ", expected.index,
              " ran where the trace has step ", cursor_, " (",
              cursor_ < t_.steps.size() ? names[t_.steps[cursor_].type] : "past the end", " of ",
              cursor_ < t_.steps.size() ? std::to_string(t_.steps[cursor_].index) : "-",
              "); the blocks ran in another order than the trace was made for");
  begin(cursor_);
}

void ChunkedMemory::begin(size_t s) {
  KOLOS_CHECK(s == cursor_, "internal error: trace step ", s, ", expected ", cursor_);
  end_current_step();
  executor_->begin_step(s);
  std::vector<bool> needed(bound_.size(), false);
  for (ChunkId c : t_.access.steps[s]) needed[c] = true;
  for (ChunkId c = 0; c < bound_.size(); ++c) {
    if (bound_[c] && !needed[c]) bind(c, nullptr);
  }
  for (ChunkId c : t_.access.steps[s]) bind(c, executor_->chunk(c));
  // ZeRO-3: this step's parameter chunks from their owners (launched
  // during the step before, or now), then the next step's, launched to
  // run while this one computes (their chunks are in this step's trace).
  if (!t_.gather_at[s].empty()) {
    const auto start = std::chrono::steady_clock::now();
    if (!t_.ahead[s]) launch_gathers(s, false);
    for (comm::WorkPtr& work : gathers_) work->wait();
    gathers_.clear();
    gather_wait_s_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (s + 1 < t_.steps.size() && t_.ahead[s + 1]) launch_gathers(s + 1, true);
  for (ChunkId c : t_.zero_at[s]) {
    std::memset(executor_->chunk(c), 0, static_cast<size_t>(kind_bytes(t_.kind_of[c])));
  }
  // Backward accumulates into gradient chunks; the tied step's pipeline
  // sum replaces them in place (a chunk written back and reloaded clean
  // in between must be written again).
  if (t_.steps[s].type == TraceStep::kBackward || t_.steps[s].type == TraceStep::kTied) {
    for (ChunkId c : t_.access.steps[s]) {
      if (t_.kind_of[c] == kGrad) executor_->mark_dirty(c);
    }
  }
  count_resident();
  current_ = s;
  in_step_ = true;
  cursor_ = s + 1;
}

// ZeRO-3: launches the gathers of step s's parameter chunks (`ahead`:
// while the step before it computes), counted in the gather metrics.
void ChunkedMemory::launch_gathers(size_t s, bool ahead) {
  for (ChunkId c : t_.gather_at[s]) {
    gathers_.push_back(broadcast_from_owner(c));
    gathered_bytes_ += kind_bytes(t_.kind_of[c]);
    if (ahead) gathered_ahead_bytes_ += kind_bytes(t_.kind_of[c]);
  }
}

void ChunkedMemory::count_resident() {
  int64_t by_kind[kKinds] = {0, 0, 0, 0, 0};
  int64_t total = 0;
  for (ChunkId c = 0; c < bound_.size(); ++c) {
    if (!executor_->resident(c)) continue;
    by_kind[t_.kind_of[c]] += kind_bytes(t_.kind_of[c]);
    total += kind_bytes(t_.kind_of[c]);
  }
  if (total > peak_total_) {
    peak_total_ = total;
    std::copy(by_kind, by_kind + kKinds, peak_by_kind_);
  }
}

// ---- reductions and norms -------------------------------------------------------

// Ends the step in progress (if any): the reductions launched at the end
// of the step before are waited for and their gradients' norms taken;
// the gradients this step made final are then launched, averaged over
// their domain (every rank holds every gradient chunk; the trace, and so
// the order of these collectives, is the same on every rank of the data
// group), and run while the next step computes (their chunks are in its
// trace step too, so they stay resident).
void ChunkedMemory::end_current_step() {
  if (!in_step_) return;
  finish_reductions();
  torch::NoGradGuard no_grad;
  for (size_t i : t_.norm_at[current_]) {
    const size_t k = layout_.slots[i].chunk;
    const DataDomain& d = domain(k);
    const bool to_owner = zero_stage_ >= 2 && !t_.is_tied[i];
    const int root = owner(k);
    if (d.ranks == 1) {
      if (d.factor != 1.0) params_[i].tensor.mutable_grad().mul_(d.factor);
      if (!t_.is_tied[i]) take_norm(i);
      continue;
    }
    // The gradient's bytes in its chunk, apart from the parameter's .grad
    // (whose storage is unbound when the chunk leaves a step).
    const at::Tensor& grad = params_[i].tensor.grad();
    at::Tensor in_chunk = at::from_blob(executor_->chunk(id(kGrad, k)) + slot_offset(kGrad, i),
                                        {grad.numel()}, grad.options());
    // train.reduce_dtype = "fp32" under bf16/fp16: averaged in fp32, as
    // the dp plugin's buckets do.
    at::Tensor reduced = reduce_in_fp32_ ? in_chunk.to(at::kFloat) : in_chunk;
    comm::WorkPtr work;
    if (to_owner) {
      // ZeRO-2/3: to the chunk's owner only (a reduce-scatter in which
      // every other rank's share is empty).
      std::vector<at::Tensor> inputs(static_cast<size_t>(d.ranks), reduced.narrow(0, 0, 0));
      inputs[static_cast<size_t>(root)] = reduced;
      work = d.group->reduce_scatter(d.index == root ? reduced : reduced.narrow(0, 0, 0), inputs,
                                     comm::ReduceOp::kAvg);
    } else {
      work = d.group->all_reduce(reduced, comm::ReduceOp::kAvg);
    }
    reduced_bytes_ += reduced.numel() * reduced.element_size();
    if (t_.overlap[current_]) overlapped_bytes_ += reduced.numel() * reduced.element_size();
    ++reductions_;
    pending_.push_back(
        Reduction{work, i, in_chunk, reduced, d.factor, to_owner && d.index != root});
  }
  if (!t_.overlap[current_]) finish_reductions();
  in_step_ = false;
}

// Waits for the reductions in flight: each gradient's result goes into
// its chunk (from fp32 when reduced in fp32), times its domain's factor,
// and its norm is taken where this rank has the result. (On ZeRO's other
// ranks the chunk's bytes are dead once its last gradient is reduced: the
// executor writes nothing of them back.)
void ChunkedMemory::finish_reductions() {
  if (pending_.empty()) return;
  torch::NoGradGuard no_grad;
  for (Reduction& r : pending_) {
    if (!finishing_ || r.work->is_completed()) ++completed_before_finish_;
    r.work->wait();
    if (r.reduced.data_ptr() != r.in_chunk.data_ptr()) r.in_chunk.copy_(r.reduced);
    if (r.factor != 1.0 && !r.elsewhere) r.in_chunk.mul_(r.factor);
    // A tied weight's norm after the pipeline's sum.
    if (!t_.is_tied[r.param] && !r.elsewhere) take_norm(r.param);
  }
  pending_.clear();
}

// As in memory: finiteness of the gradient as backward left it; the norm
// after the engine's unscaling (fp16: 1 / loss scale, applied to this
// copy here and to the gradient itself in step()).
void ChunkedMemory::take_norm(size_t i) {
  const at::Tensor& grad = params_[i].tensor.grad();
  finite_[i] = !unscale_ || torch::isfinite(grad).all().item<bool>();
  norms_[i] = (unscale_ ? grad * *unscale_ : grad).norm();
}

// ZeRO-2/3: each gradient's norm and finiteness were taken by its chunk's
// owner; one sum over each domain gives them to every rank of it,
// exactly (every other rank adds zero). Tied weights' and unused
// parameters' are everywhere already.
void ChunkedMemory::share_norms() {
  if (zero_stage_ < 2 || norms_shared_) return;
  torch::NoGradGuard no_grad;
  for (size_t d = 0; d < domains_.size(); ++d) {
    if (domains_[d].ranks == 1) continue;
    const std::vector<size_t>& members = shared_norms_[d];
    const size_t n = members.size();
    // [0, n): norms; [n, 2n): 1 where a gradient is not finite.
    std::vector<double> values(2 * n, 0.0);
    for (size_t j = 0; j < n; ++j) {
      const size_t i = members[j];
      if (!norms_[i].defined()) continue;
      values[j] = norms_[i].item<double>();
      values[n + j] = finite_[i] ? 0.0 : 1.0;
    }
    domains_[d]
        .group
        ->all_reduce(at::from_blob(values.data(), {static_cast<int64_t>(2 * n)}, at::kDouble),
                     comm::ReduceOp::kSum)
        ->wait();
    for (size_t j = 0; j < n; ++j) {
      // Widened to double and back to the gradient's dtype: exact.
      norms_[members[j]] = torch::full({}, values[j], at::kDouble).to(dtype_);
      finite_[members[j]] = values[n + j] == 0.0;
    }
  }
  norms_shared_ = true;
}

// The tied weights' norms, once the pipeline has summed them (the engine
// asks for finiteness or the norm only after that).
void ChunkedMemory::tied_norms() {
  if (t_.tied_step == ChunkTrace::kNoStep || tied_done_) return;
  KOLOS_CHECK(in_step_ && current_ == t_.tied_step, "internal error: ", name(),
              ": tied gradients asked for outside their step");
  torch::NoGradGuard no_grad;
  for (size_t i : t_.tied) take_norm(i);
  tied_done_ = true;
}

}  // namespace kolos::chunks
