// The chunks plugin (chunked_memory.h): ChunkedMemory's state as the
// engine sees it. The peak of resident chunks by kind (memory()), and
// checkpoints' copies of the parameters (or their fp32 masters) and AdamW's
// moments, read from the chunks and, after loading, written back into them.
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "kolos/core/error.h"

#include "chunked_memory.h"

namespace kolos::chunks {

MemoryStats ChunkedMemory::memory() const {
  MemoryStats m;
  m.parameter_bytes = peak_by_kind_[kParam];
  m.gradient_bytes = peak_by_kind_[kGrad];
  m.optimizer_bytes = peak_by_kind_[kExpAvg] + peak_by_kind_[kExpAvgSq] + peak_by_kind_[kMaster];
  return m;
}

// Checkpoints: copies of the states, read from whichever tier holds each
// chunk (they live until the next step; loading writes them back). Under
// bf16/fp16 a checkpoint saves a parameter's fp32 master (master_of).
std::vector<PlacedParameter> ChunkedMemory::parameters_at_rest() {
  materialize();
  std::vector<PlacedParameter> out;
  const std::map<const void*, size_t> index = param_index();
  for (const auto& p : model_->placed_parameters()) {
    const auto it = index.find(p.tensor.unsafeGetTensorImpl());
    if (it == index.end()) {
      out.push_back(p);
      continue;
    }
    out.push_back(PlacedParameter{p.name, materialized_[kParam][it->second], p.placement, p.block});
  }
  return out;
}

at::Tensor ChunkedMemory::master_of(const at::Tensor& param) {
  if (!low_ || materialized_.empty()) return at::Tensor();
  const auto it = materialized_index_.find(param.unsafeGetTensorImpl());
  return it == materialized_index_.end() ? at::Tensor() : materialized_[kMaster][it->second];
}

std::vector<StatePiece> ChunkedMemory::optimizer_state() {
  materialize();
  std::vector<StatePiece> pieces;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    pieces.push_back(StatePiece{"exp_avg/" + p.name, materialized_[kExpAvg][i], p.placement});
    pieces.push_back(StatePiece{"exp_avg_sq/" + p.name, materialized_[kExpAvgSq][i], p.placement});
  }
  return pieces;
}

void ChunkedMemory::after_load() {
  KOLOS_CHECK(!materialized_.empty(), "internal error: ", name(),
              ": after_load() without the state it was loaded into");
  torch::NoGradGuard no_grad;
  if (low_) {
    // The masters were loaded; the parameters are their roundings.
    for (size_t i = 0; i < params_.size(); ++i) {
      materialized_[kParam][i].copy_(materialized_[kMaster][i]);
    }
  }
  for (Kind kind : {kParam, kExpAvg, kExpAvgSq, kMaster}) {
    if (kind >= kinds_) continue;
    std::vector<std::byte> bytes(static_cast<size_t>(kind_bytes(kind)));
    for (size_t k = 0; k < num_chunks_; ++k) {
      if (!holds(kind, k)) continue;  // another rank's
      std::fill(bytes.begin(), bytes.end(), std::byte{0});
      const auto [first, last] = chunk_params_[k];
      for (size_t i = first; i < last; ++i) {
        const at::Tensor& t = materialized_[kind][i];
        std::memcpy(bytes.data() + slot_offset(kind, i), t.data_ptr(),
                    static_cast<size_t>(slot_bytes(kind, i)));
      }
      executor_->write_chunk(id(kind, k), bytes.data());
    }
  }
  materialized_.clear();
}

void ChunkedMemory::materialize() {
  if (!materialized_.empty()) return;
  finish_skipped_step();
  KOLOS_CHECK(cursor_ == 0, name(), ": a checkpoint was asked for in the middle of a step");
  materialized_.assign(kKinds, std::vector<at::Tensor>(params_.size()));
  materialized_index_.clear();
  for (Kind kind : {kParam, kExpAvg, kExpAvgSq, kMaster}) {
    if (kind >= kinds_) continue;
    std::vector<std::byte> bytes(static_cast<size_t>(kind_bytes(kind)));
    for (size_t k = 0; k < num_chunks_; ++k) {
      if (holds(kind, k)) executor_->read_chunk(id(kind, k), bytes.data());
      if (shards(k) > 1 && (kind != kParam || zero_stage_ == 3)) {
        // ZeRO: the owner's optimizer chunk (and ZeRO-3's parameter
        // chunk), to every rank (a checkpoint holds every piece on every
        // rank of the domain).
        at::Tensor t =
            at::from_blob(bytes.data(), {kind_bytes(kind)}, at::TensorOptions().dtype(at::kByte));
        domain(k).group->broadcast(t, owner(k))->wait();
      }
      const auto [first, last] = chunk_params_[k];
      for (size_t i = first; i < last; ++i) {
        at::Tensor t =
            torch::empty(params_[i].tensor.sizes(), kind == kParam ? dtype_ : at::kFloat);
        std::memcpy(t.data_ptr(), bytes.data() + slot_offset(kind, i),
                    static_cast<size_t>(slot_bytes(kind, i)));
        materialized_[kind][i] = t;
        if (kind == kParam) materialized_index_[t.unsafeGetTensorImpl()] = i;
      }
    }
  }
}

}  // namespace kolos::chunks
