// What the ZeRO stages share (see zero.h).
#include "zero.h"

#include <torch/torch.h>

#include <malloc.h>

#include <algorithm>
#include <cstdio>

#include "kolos/core/error.h"
#include "kolos/core/mesh.h"
#include "kolos/core/tensor_storage.h"

namespace kolos::zero {

int64_t ZeroStrategy::Slot::rows_of(int64_t r) const {
  const int64_t begin = std::min(rows, r * chunk);
  return std::min(rows, begin + chunk) - begin;
}

int64_t ZeroStrategy::Slot::bytes() const { return bytes_of(param.tensor); }

int64_t ZeroStrategy::bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

void ZeroStrategy::track(int64_t& current, int64_t& peak, int64_t delta) {
  current += delta;
  peak = std::max(peak, current);
}

void ZeroStrategy::shard_parameters(Model& model, const DeviceMesh& mesh) {
  model_ = &model;
  data_domain(domains_, mesh, AxisSet{});  // domains_[0]: the whole data group
  group_ = domains_[0].group;
  ranks_ = domains_[0].ranks;
  index_ = domains_[0].index;
  if (ranks_ == 1 && mesh.rank() == 0) {
    std::fprintf(stderr,
                 "kolos: warning: %s with a data-parallel group of one rank (dp x sp = 1): "
                 "nothing is sharded, the run behaves like dp with extra copies; use more "
                 "ranks or parallel.data > 1 to save memory\n",
                 name().c_str());
  }
  for (auto& p : model.placed_parameters()) {
    if (!p.tensor.requires_grad()) {
      frozen_.push_back(p);
      continue;
    }
    KOLOS_CHECK_KIND(kConfig, p.tensor.dim() >= 1, name(), ": parameter ", p.name,
                     " is a scalar; ZeRO shards parameters along dim 0");
    Slot s;
    s.param = p;
    s.domain = data_domain(domains_, mesh, p.placement.sharded());
    const Domain& d = domains_[s.domain];
    s.rows = p.tensor.size(0);
    s.row_numel = s.rows > 0 ? p.tensor.numel() / s.rows : 0;
    s.chunk = (s.rows + d.ranks - 1) / d.ranks;
    s.shard = p.placement.shard(0, d.index, d.ranks, d.axes);
    KOLOS_CHECK(s.shard.local_shape()[0] == s.chunk, name(), ": parameter ", p.name,
                " has a local dim 0 of ", s.rows, " but its placement ", p.placement.to_string(),
                " says otherwise");
    slot_of_impl_[p.tensor.unsafeGetTensorImpl()] = slots_.size();
    slots_.push_back(std::move(s));
  }
}

void ZeroStrategy::keep_built_rows(const std::vector<PlacedParameter>& parameters,
                                   const DeviceMesh& mesh) {
  torch::NoGradGuard no_grad;
  data_domain(domains_, mesh, AxisSet{});  // domains_[0] first, as shard_parameters has it
  bool freed = false;
  for (const auto& p : parameters) {
    const at::Tensor& t = p.tensor;
    const void* impl = t.unsafeGetTensorImpl();
    // Frozen parameters stay whole; setup() refuses scalars.
    if (!t.requires_grad() || t.dim() < 1 || built_rows_.count(impl)) continue;
    check_owns_storage(p);
    const Domain& d = domains_[data_domain(domains_, mesh, p.placement.sharded())];
    const int64_t rows = t.size(0);
    const int64_t chunk = (rows + d.ranks - 1) / d.ranks;
    const int64_t begin = std::min(rows, d.index * chunk);
    const int64_t mine = std::min(rows, begin + chunk) - begin;
    built_rows_[impl] = t.detach().narrow(0, begin, mine).clone();
    free_storage(t);
    freed = true;
  }
  // The freed pages go back to the kernel now: left in malloc's heap
  // between the rows kept, they would be resident until the next block
  // happens to reuse them, and building a whole model's worth of blocks
  // would leave about the whole model resident.
  if (freed) malloc_trim(0);
}

void ZeroStrategy::check_owns_storage(const PlacedParameter& p) const {
  const at::Tensor& t = p.tensor;
  KOLOS_CHECK(t.is_contiguous() && t.storage_offset() == 0 &&
                  static_cast<int64_t>(t.storage().nbytes()) == bytes_of(t),
              name(), ": parameter ", p.name,
              " does not own its storage (a view of another tensor?); ZeRO-3 frees each "
              "parameter's storage between uses");
}

void ZeroStrategy::build_groups(const std::vector<std::vector<size_t>>& members) {
  torch::NoGradGuard no_grad;
  for (const auto& list : members) {
    ShardGroup g;
    g.slots = list;
    if (!list.empty()) g.domain = slots_[list.front()].domain;
    for (size_t i : list) {
      KOLOS_CHECK(slots_[i].domain == g.domain, name(), ": parameters of one group are sharded "
                  "over different ranks (", slots_[i].param.name, ")");
      KOLOS_CHECK(slots_[i].param.tensor.dtype() == slots_[list.front()].param.tensor.dtype(),
                  name(), ": parameters of one group have different dtypes (", slots_[i].param.name,
                  ")");
      slots_[i].group = groups_.size();
      slots_[i].offset = g.shard_numel;
      g.shard_numel += slots_[i].shard_numel();
    }
    if (!list.empty()) {
      const auto options = slots_[list.front()].param.tensor.options().requires_grad(false);
      g.shard_params = torch::zeros({g.shard_numel}, options);
      g.shard_grads = torch::zeros({g.shard_numel}, options);
      for (size_t i : list) {
        Slot& s = slots_[i];
        const auto shape = s.shard.local_shape();
        s.master = g.shard_params.narrow(0, s.offset, s.shard_numel()).view(shape);
        s.grad_shard = g.shard_grads.narrow(0, s.offset, s.shard_numel()).view(shape);
        const int64_t index = domains_[s.domain].index;
        const int64_t mine = s.rows_of(index);
        const auto kept = built_rows_.find(s.param.tensor.unsafeGetTensorImpl());
        if (kept != built_rows_.end()) {
          KOLOS_CHECK(kept->second.size(0) == mine, name(), ": parameter ", s.param.name, " kept ",
                      kept->second.size(0), " rows as it was built, but its shard has ", mine);
        }
        if (mine > 0) {
          s.master.narrow(0, 0, mine)
              .copy_(kept != built_rows_.end()
                         ? kept->second
                         : s.param.tensor.detach().narrow(0, index * s.chunk, mine));
        }
      }
    }
    groups_.push_back(std::move(g));
  }
  built_rows_.clear();  // with the rows of parameters this rank does not hold (other stages')
}

void ZeroStrategy::make_optimizer(const RunConfig& config) {
  optimizer_ = std::make_unique<AdamW>(adamw_settings(config.optim));
  for (auto& s : slots_) optimizer_->add(s.param.name, s.master, s.grad_shard, s.shard);
}

// Rank-major layout of a group: row r of the [N][S] buffer holds chunk r of
// every parameter of the group, each at its offset, padding left as zeros.
void ZeroStrategy::scatter_rows(const Slot& s, const at::Tensor& whole,
                                const at::Tensor& rank_major) const {
  const int64_t S = groups_[s.group].shard_numel;
  const int64_t ranks = domains_[s.domain].ranks;
  at::Tensor src = whole.reshape({s.rows, s.row_numel});
  at::Tensor dst = rank_major.view({ranks, S});
  for (int64_t r = 0; r < ranks; ++r) {
    const int64_t n = s.rows_of(r);
    if (n <= 0) continue;
    dst[r]
        .narrow(0, s.offset, n * s.row_numel)
        .view({n, s.row_numel})
        .copy_(src.narrow(0, r * s.chunk, n));
  }
}

void ZeroStrategy::gather_rows(const Slot& s, const at::Tensor& rank_major,
                               const at::Tensor& whole) const {
  const int64_t S = groups_[s.group].shard_numel;
  const int64_t ranks = domains_[s.domain].ranks;
  at::Tensor src = rank_major.view({ranks, S});
  at::Tensor dst = whole.view({s.rows, s.row_numel});
  for (int64_t r = 0; r < ranks; ++r) {
    const int64_t n = s.rows_of(r);
    if (n <= 0) continue;
    dst.narrow(0, r * s.chunk, n)
        .copy_(src[r].narrow(0, s.offset, n * s.row_numel).view({n, s.row_numel}));
  }
}

MemoryStats ZeroStrategy::shard_memory() const {
  MemoryStats m;
  for (const auto& p : frozen_) m.parameter_bytes += bytes_of(p.tensor);
  for (const auto& g : groups_) {
    m.parameter_bytes += bytes_of(g.shard_params);
    m.gradient_bytes += bytes_of(g.shard_grads);
  }
  m.optimizer_bytes = optimizer_->state_bytes() + optimizer_->master_bytes();
  return m;
}

std::vector<GradPiece> ZeroStrategy::grad_pieces() {
  std::vector<GradPiece> pieces;
  for (auto& s : slots_) pieces.push_back(GradPiece{s.grad_shard, s.shard});
  return pieces;
}

std::vector<StatePiece> ZeroStrategy::optimizer_state() { return optimizer_->state_pieces(); }
int64_t ZeroStrategy::optimizer_steps() const { return optimizer_->step_count(); }
void ZeroStrategy::set_optimizer_steps(int64_t steps) { optimizer_->set_step_count(steps); }

}  // namespace kolos::zero
