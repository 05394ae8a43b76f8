// ZeRO stages 1, 2 and 3 (see zero.h for the protocol).
#include "zero.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <unordered_set>

#include "kolos/core/error.h"
#include "kolos/core/grad_hooks.h"
#include "kolos/core/mesh.h"

namespace kolos::zero {
namespace {

// Reductions launched but not yet completed (besides the bucket being filled):
// bounds the unsharded gradient staging a rank holds (FSDP's rate limiter).
constexpr size_t kMaxReductionsInFlight = 1;
// Parameter all-gathers after a stage 1/2 step kept in flight at once.
constexpr size_t kMaxGathersInFlight = 2;

int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// Frees / re-allocates a tensor's storage in place. The tensor keeps its
// shape; every view of it and every tensor autograd saved from it share the
// StorageImpl, so they lose and regain the data together.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(bytes_of(t));
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

// A tensor over `t`'s memory that does not share its autograd version
// counter: writing the gathered values through it does not invalidate the
// tensors autograd saved in forward (they are the same values).
at::Tensor alias_of(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options());
}

bool contains(const std::vector<size_t>& v, size_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

int64_t ZeroStrategy::Slot::rows_of(int64_t r) const {
  const int64_t begin = std::min(rows, r * chunk);
  return std::min(rows, begin + chunk) - begin;
}

int64_t ZeroStrategy::Slot::bytes() const { return bytes_of(param.tensor); }

ZeroStrategy::ZeroStrategy(int stage) : stage_(stage) {}

// [parallel.zero]: stage 3 owns reshard_after_forward; stages 1 and 2 have
// no keys besides the core's stage.
void ZeroStrategy::configure(const PluginContext& context) {
  if (stage_ != 3) {
    RolePlugin::configure(context);
    return;
  }
  struct Settings {
    bool reshard_after_forward = true;
  } settings;
  SettingsTable<Settings>("parallel.zero")
      .boolean("reshard_after_forward", &Settings::reshard_after_forward)
      .read(context.section, settings, context.core_keys, context.owner);
  reshard_after_forward_ = settings.reshard_after_forward;
}

ZeroStrategy::~ZeroStrategy() {
  // Reductions or gathers still queued (an exception mid-step) must finish
  // before the buffers they use go away; never throw from here.
  try {
    for (auto& r : in_flight_) r.work->wait();
    for (auto& g : groups_) {
      if (g.gather_work) g.gather_work->wait();
    }
  } catch (...) {
  }
  // The model's block hooks point here, but the model is not touched: the
  // engine destroys it first (a model outliving its strategy must not run).
}

void ZeroStrategy::setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) {
  model_ = &model;
  group_ = mesh.group(AxisSet{Axis::kDP, Axis::kSP});
  ranks_ = group_->size();
  index_ = group_->rank();
  if (ranks_ == 1 && mesh.rank() == 0) {
    std::fprintf(stderr,
                 "kolos: warning: %s with a data-parallel group of one rank (dp x sp = 1): "
                 "nothing is sharded, the run behaves like dp with extra copies; use more "
                 "ranks or parallel.data > 1 to save memory\n",
                 name().c_str());
  }

  const AxisSet axes{Axis::kDP, Axis::kSP};
  for (auto& p : model.placed_parameters()) {
    if (!p.tensor.requires_grad()) {
      frozen_.push_back(p);
      continue;
    }
    KOLOS_CHECK_KIND(kConfig, p.tensor.dim() >= 1, name(), ": parameter ", p.name,
                     " is a scalar; ZeRO shards parameters along dim 0");
    Slot s;
    s.param = p;
    s.rows = p.tensor.size(0);
    s.row_numel = s.rows > 0 ? p.tensor.numel() / s.rows : 0;
    s.chunk = (s.rows + ranks_ - 1) / ranks_;
    s.shard = p.placement.shard(0, index_, ranks_, axes);
    KOLOS_CHECK(s.shard.local_shape()[0] == s.chunk, name(), ": parameter ", p.name,
                " has a local dim 0 of ", s.rows, " but its placement ", p.placement.to_string(),
                " says otherwise");
    if (stage_ == 3) {
      KOLOS_CHECK(p.tensor.is_contiguous() && p.tensor.storage_offset() == 0 &&
                      static_cast<int64_t>(p.tensor.storage().nbytes()) == s.bytes(),
                  name(), ": parameter ", p.name,
                  " does not own its storage (a view of another tensor?); ZeRO-3 frees each "
                  "parameter's storage between uses");
    }
    slot_of_impl_[p.tensor.unsafeGetTensorImpl()] = slots_.size();
    slots_.push_back(std::move(s));
  }

  if (stage_ == 3) {
    // One group per block, so that a block's parameters come in one gather.
    std::vector<std::vector<size_t>> members(model.blocks().size());
    for (size_t i = 0; i < slots_.size(); ++i) members.at(slots_[i].param.block).push_back(i);
    build_groups(members);
    for (size_t g = groups_.size(); g-- > 0;) launch_order_.push_back(g);
  } else {
    const int64_t bucket_bytes = config.parallel.bucket_kb > 0
                                     ? config.parallel.bucket_kb * 1024
                                     : config.parallel.bucket_mb * 1024 * 1024;
    build_groups(byte_buckets(std::max<int64_t>(1, bucket_bytes)));
    for (size_t g = 0; g < groups_.size(); ++g) launch_order_.push_back(g);
  }

  optimizer_ = std::make_unique<AdamW>(adamw_settings(config.optim));
  for (auto& s : slots_) optimizer_->add(s.param.name, s.master, s.grad_shard, s.shard);
  install_grad_hooks();

  if (stage_ == 3) {
    find_block_uses(config);
    for (auto& g : groups_) g.state = GatherState::kGathered;
    free_all_groups();
    gathered_now_ = gathered_peak_ = 0;
    install_block_hooks();
  }
}

std::vector<std::vector<size_t>> ZeroStrategy::byte_buckets(int64_t bucket_bytes) const {
  // As dp: reverse parameter order (roughly the order backward produces
  // gradients), the first bucket at most 1 MiB so communication starts early.
  constexpr int64_t kFirstBucketBytes = 1 << 20;
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> current;
  int64_t bytes = 0;
  for (size_t k = slots_.size(); k-- > 0;) {
    const at::Tensor& t = slots_[k].param.tensor;
    const int64_t limit =
        buckets.empty() ? std::min(bucket_bytes, kFirstBucketBytes) : bucket_bytes;
    if (!current.empty() && (slots_[current.front()].param.tensor.dtype() != t.dtype() ||
                             bytes + bytes_of(t) > limit)) {
      buckets.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
    current.push_back(k);
    bytes += bytes_of(t);
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

void ZeroStrategy::build_groups(const std::vector<std::vector<size_t>>& members) {
  torch::NoGradGuard no_grad;
  for (const auto& list : members) {
    Group g;
    g.slots = list;
    for (size_t i : list) {
      KOLOS_CHECK(slots_[i].param.tensor.dtype() == slots_[list.front()].param.tensor.dtype(),
                  name(), ": parameters of one block have different dtypes (", slots_[i].param.name,
                  ")");
      slots_[i].group = groups_.size();
      slots_[i].offset = g.shard_numel;
      g.shard_numel += slots_[i].shard_numel();
    }
    if (!list.empty()) {
      const auto options = slots_[list.front()].param.tensor.options().requires_grad(false);
      g.shard_params = torch::zeros({g.shard_numel}, options);
      g.shard_grads = torch::zeros({g.shard_numel}, options);
      int64_t whole = 0;
      for (size_t i : list) whole += slots_[i].param.tensor.numel();
      if (stage_ == 1) g.full_grads = torch::zeros({whole}, options);
      int64_t offset = 0;
      for (size_t i : list) {
        Slot& s = slots_[i];
        const auto shape = s.shard.local_shape();
        s.master = g.shard_params.narrow(0, s.offset, s.shard_numel()).view(shape);
        s.grad_shard = g.shard_grads.narrow(0, s.offset, s.shard_numel()).view(shape);
        const int64_t mine = s.rows_of(index_);
        if (mine > 0) {
          s.master.narrow(0, 0, mine)
              .copy_(s.param.tensor.detach().narrow(0, index_ * s.chunk, mine));
        }
        if (stage_ == 1) {
          // Whole gradients as views into the bucket: micro-batches sum in place.
          at::Tensor& t = s.param.tensor;
          t.mutable_grad() = g.full_grads.narrow(0, offset, t.numel()).view(t.sizes());
          offset += t.numel();
        }
      }
    }
    groups_.push_back(std::move(g));
  }
}

void ZeroStrategy::install_grad_hooks() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    accumulators_.push_back(on_grad_accumulated(slots_[i].param.tensor, slots_[i].param.name,
                                                [this, i] { on_grad_ready(i); }));
  }
}

// ---- one step ---------------------------------------------------------------

void ZeroStrategy::zero_grad() {
  torch::NoGradGuard no_grad;
  if (stage_ == 3) free_all_groups();  // left gathered by a forward without backward
  gathered_peak_ = gathered_now_;
  staging_peak_ = staging_now_;
  for (auto& g : groups_) {
    if (g.slots.empty()) continue;
    if (g.full_grads.defined()) g.full_grads.zero_();
    g.shard_grads.zero_();
  }
  // Stage 1/2: the whole parameters are the truth at rest (a checkpoint
  // loads into them); the shard the optimizer steps is refreshed from them.
  if (stage_ < 3) refresh_masters();
}

void ZeroStrategy::prepare_backward(bool sync) {
  if (backward_open_) close_micro_batch();
  sync_ = sync;
  if (stage_ == 1 && !sync) return;  // accumulation: gradients sum in place, no communication
  for (auto& g : groups_) {
    g.pending = g.slots.size();
    g.launched = false;
  }
  next_launch_ = 0;
  backward_open_ = true;
}

void ZeroStrategy::on_grad_ready(size_t index) {
  Slot& s = slots_[index];
  Group& g = groups_[s.group];
  if (stage_ == 1) {
    if (!sync_ || !backward_open_) return;
    if (g.pending > 0) --g.pending;
    launch_ready(/*force=*/false);
    return;
  }
  if (!backward_open_) return;
  torch::NoGradGuard no_grad;
  at::Tensor& grad = s.param.tensor.mutable_grad();
  if (grad.defined()) {
    if (!g.staging.defined()) {
      g.staging = torch::zeros({ranks_ * g.shard_numel}, grad.options());
      track(staging_now_, staging_peak_, bytes_of(g.staging));
    }
    scatter_rows(s, grad, g.staging);
    grad.reset();  // no whole gradient outlives its micro-batch
  }
  if (g.pending > 0 && --g.pending == 0 && stage_ == 3) {
    free_group(s.group);  // every parameter of the block has its gradient: reshard
  }
  launch_ready(/*force=*/false);
}

// Launches reductions in launch order while groups are complete (all of
// them when forced at the end of a micro-batch), so that every rank
// enqueues the same collectives in the same order.
void ZeroStrategy::launch_ready(bool force) {
  while (next_launch_ < launch_order_.size()) {
    const size_t index = launch_order_[next_launch_];
    Group& g = groups_[index];
    if (!g.slots.empty()) {
      if (!force && g.pending > 0) break;
      if (stage_ == 1) {
        in_flight_.push_back(Reduction{
            index, g.full_grads, {}, group_->all_reduce(g.full_grads, comm::ReduceOp::kAvg)});
      } else {
        if (!g.staging.defined()) {  // no gradient reached this group: reduce zeros
          g.staging = torch::zeros({ranks_ * g.shard_numel}, g.shard_grads.options());
          track(staging_now_, staging_peak_, bytes_of(g.staging));
        }
        at::Tensor out = torch::empty({g.shard_numel}, g.shard_grads.options());
        comm::WorkPtr work = group_->reduce_scatter_flat(out, g.staging, comm::ReduceOp::kAvg);
        in_flight_.push_back(Reduction{index, g.staging, out, std::move(work)});
        g.staging = at::Tensor();
        while (in_flight_.size() > kMaxReductionsInFlight) complete_oldest();
      }
      g.launched = true;
    }
    ++next_launch_;
  }
}

void ZeroStrategy::complete_oldest() {
  Reduction r = std::move(in_flight_.front());
  in_flight_.pop_front();
  r.work->wait();
  if (stage_ >= 2) {
    torch::NoGradGuard no_grad;
    groups_[r.group].shard_grads.add_(r.output);
    track(staging_now_, staging_peak_, -bytes_of(r.input));
  }
}

void ZeroStrategy::complete_all() {
  while (!in_flight_.empty()) complete_oldest();
}

void ZeroStrategy::close_micro_batch() {
  launch_ready(/*force=*/true);
  if (stage_ == 3) free_all_groups();
  backward_open_ = false;
}

void ZeroStrategy::finish_backward() {
  if (backward_open_) close_micro_batch();
  complete_all();
  if (stage_ == 1) copy_grad_shards_from_whole();
}

std::vector<GradPiece> ZeroStrategy::grad_pieces() {
  std::vector<GradPiece> pieces;
  for (auto& s : slots_) pieces.push_back(GradPiece{s.grad_shard, s.shard});
  return pieces;
}

void ZeroStrategy::step(double lr) {
  optimizer_->step(lr);
  if (stage_ < 3) gather_params_after_step();
}

void ZeroStrategy::copy_grad_shards_from_whole() {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    const int64_t mine = s.rows_of(index_);
    if (mine > 0) {
      s.grad_shard.narrow(0, 0, mine)
          .copy_(s.param.tensor.grad().narrow(0, index_ * s.chunk, mine));
    }
  }
}

void ZeroStrategy::refresh_masters() {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    const int64_t mine = s.rows_of(index_);
    if (mine > 0) {
      s.master.narrow(0, 0, mine).copy_(s.param.tensor.detach().narrow(0, index_ * s.chunk, mine));
    }
  }
}

void ZeroStrategy::gather_params_after_step() {
  torch::NoGradGuard no_grad;
  struct Pending {
    size_t group;
    at::Tensor out;
    comm::WorkPtr work;
  };
  std::deque<Pending> pending;
  auto drain_one = [&] {
    Pending p = std::move(pending.front());
    pending.pop_front();
    p.work->wait();
    for (size_t i : groups_[p.group].slots) gather_rows(slots_[i], p.out, slots_[i].param.tensor);
    track(gathered_now_, gathered_peak_, -bytes_of(p.out));
  };
  for (size_t index = 0; index < groups_.size(); ++index) {
    Group& g = groups_[index];
    if (g.slots.empty()) continue;
    at::Tensor out = torch::empty({ranks_ * g.shard_numel}, g.shard_params.options());
    track(gathered_now_, gathered_peak_, bytes_of(out));
    pending.push_back(Pending{index, out, group_->all_gather_flat(out, g.shard_params)});
    if (pending.size() >= kMaxGathersInFlight) drain_one();
  }
  while (!pending.empty()) drain_one();
}

// Rank-major layout of a group: row r of the [N][S] buffer holds chunk r of
// every parameter of the group, each at its offset, padding left as zeros.
void ZeroStrategy::scatter_rows(const Slot& s, const at::Tensor& whole,
                                const at::Tensor& rank_major) const {
  const int64_t S = groups_[s.group].shard_numel;
  at::Tensor src = whole.reshape({s.rows, s.row_numel});
  at::Tensor dst = rank_major.view({ranks_, S});
  for (int64_t r = 0; r < ranks_; ++r) {
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
  at::Tensor src = rank_major.view({ranks_, S});
  at::Tensor dst = whole.view({s.rows, s.row_numel});
  for (int64_t r = 0; r < ranks_; ++r) {
    const int64_t n = s.rows_of(r);
    if (n <= 0) continue;
    dst.narrow(0, r * s.chunk, n)
        .copy_(src[r].narrow(0, s.offset, n * s.row_numel).view({n, s.row_numel}));
  }
}

// ---- ZeRO-3: parameters gathered block by block -----------------------------

// Which groups each block reads. A block owns the parameters registered
// under it, but may read others' (GPT's head reads the token embedding of
// the "embed" block: tied weights). One probe forward at set-up, on a batch
// of one sequence of token 0 with every parameter still whole, walks each
// block's autograd graph back to its input and collects the parameters it
// reached. The RNG is restored afterwards so training draws what it would
// have drawn without the probe.
void ZeroStrategy::find_block_uses(const RunConfig& config) {
  const size_t blocks = model_->blocks().size();
  uses_.assign(blocks, {});
  for (size_t b = 0; b < blocks; ++b) {
    if (!groups_[b].slots.empty()) uses_[b].push_back(b);
  }
  // A pipelined model was probed before its other stages' parameters were
  // freed; otherwise probe now, with every parameter still whole.
  if (!model_->has_block_reads()) {
    model_->find_block_reads(torch::zeros({1, config.model.seq_len}, torch::kInt64));
  }
  for (size_t b = 0; b < blocks; ++b) {
    for (const void* impl : model_->block_reads()[b]) {
      auto it = slot_of_impl_.find(impl);
      if (it != slot_of_impl_.end() && !contains(uses_[b], slots_[it->second].group)) {
        uses_[b].push_back(slots_[it->second].group);
      }
    }
  }
}

void ZeroStrategy::install_block_hooks() {
  BlockHooks hooks;
  hooks.before_forward = [this](size_t block, const at::Tensor&) { before_forward(block); };
  hooks.after_forward = [this](size_t block, const at::Tensor& output) {
    after_forward(block, output);
  };
  model_->set_block_hooks(std::move(hooks));
}

void ZeroStrategy::before_forward(size_t block) {
  for (size_t g : uses_[block]) start_gather(g);
  for (size_t g : uses_[block]) finish_gather(g);
  // Prefetch: the next block's gather runs while this block computes.
  if (block + 1 < uses_.size()) {
    for (size_t g : uses_[block + 1]) start_gather(g);
  }
}

void ZeroStrategy::after_forward(size_t block, const at::Tensor& output) {
  const bool backward_follows = torch::GradMode::is_enabled() && output.requires_grad();
  if (backward_follows) {
    output.register_hook([this, block](const at::Tensor&) { before_backward(block); });
  }
  if (!reshard_after_forward_) return;
  const bool last = block + 1 == uses_.size();
  if (last && backward_follows) return;  // backward starts with this block
  for (size_t g : uses_[block]) {
    if (!last && contains(uses_[block + 1], g)) continue;
    free_group(g);
  }
}

void ZeroStrategy::before_backward(size_t block) {
  for (size_t g : uses_[block]) start_gather(g);
  for (size_t g : uses_[block]) finish_gather(g);
  if (block > 0) {
    for (size_t g : uses_[block - 1]) start_gather(g);
  }
}

void ZeroStrategy::start_gather(size_t index) {
  Group& g = groups_[index];
  if (g.slots.empty() || g.state != GatherState::kFree) return;
  g.gather_out = torch::empty({ranks_ * g.shard_numel}, g.shard_params.options());
  track(gathered_now_, gathered_peak_, bytes_of(g.gather_out));
  g.gather_work = group_->all_gather_flat(g.gather_out, g.shard_params);
  g.state = GatherState::kGathering;
}

void ZeroStrategy::finish_gather(size_t index) {
  Group& g = groups_[index];
  if (g.slots.empty() || g.state == GatherState::kGathered) return;
  if (g.state == GatherState::kFree) start_gather(index);
  g.gather_work->wait();
  g.gather_work.reset();
  torch::NoGradGuard no_grad;
  for (size_t i : g.slots) {
    Slot& s = slots_[i];
    allocate_storage(s.param.tensor);
    track(gathered_now_, gathered_peak_, s.bytes());
    gather_rows(s, g.gather_out, alias_of(s.param.tensor));
  }
  track(gathered_now_, gathered_peak_, -bytes_of(g.gather_out));
  g.gather_out = at::Tensor();
  g.state = GatherState::kGathered;
}

void ZeroStrategy::free_group(size_t index) {
  Group& g = groups_[index];
  if (g.state == GatherState::kGathering) {
    g.gather_work->wait();  // its buffer is in use until then
    g.gather_work.reset();
    track(gathered_now_, gathered_peak_, -bytes_of(g.gather_out));
    g.gather_out = at::Tensor();
  } else if (g.state == GatherState::kGathered) {
    for (size_t i : g.slots) {
      free_storage(slots_[i].param.tensor);
      track(gathered_now_, gathered_peak_, -slots_[i].bytes());
    }
  }
  g.state = GatherState::kFree;
}

void ZeroStrategy::free_all_groups() {
  for (size_t g = 0; g < groups_.size(); ++g) free_group(g);
}

void ZeroStrategy::track(int64_t& current, int64_t& peak, int64_t delta) {
  current += delta;
  peak = std::max(peak, current);
}

// ---- state and accounting ----------------------------------------------------

MemoryStats ZeroStrategy::memory() const {
  MemoryStats m;
  for (const auto& p : frozen_) m.parameter_bytes += bytes_of(p.tensor);
  for (const auto& g : groups_) {
    m.parameter_bytes += bytes_of(g.shard_params);
    m.gradient_bytes += bytes_of(g.shard_grads) + bytes_of(g.full_grads);
  }
  if (stage_ < 3) {
    for (const auto& s : slots_) m.parameter_bytes += s.bytes();  // whole, at rest
  }
  // Transient buffers at their high-water mark of the last step: gathered
  // parameters (stage 3, and the stage 1/2 all-gather buffers) and the
  // unsharded gradient staging (stage 2/3).
  m.parameter_bytes += gathered_peak_;
  m.gradient_bytes += staging_peak_;
  m.optimizer_bytes = optimizer_->state_bytes();
  return m;
}

std::vector<PlacedParameter> ZeroStrategy::parameters_at_rest() {
  if (stage_ < 3) return GradientStrategy::parameters_at_rest();
  // Model order; trainable parameters as this rank's shard.
  std::vector<PlacedParameter> out;
  for (const auto& p : model_->placed_parameters()) {
    auto it = slot_of_impl_.find(p.tensor.unsafeGetTensorImpl());
    if (it == slot_of_impl_.end()) {
      out.push_back(p);
      continue;
    }
    const Slot& s = slots_[it->second];
    out.push_back(PlacedParameter{p.name, s.master, s.shard, p.block});
  }
  return out;
}

std::vector<StatePiece> ZeroStrategy::optimizer_state() { return optimizer_->state_pieces(); }
int64_t ZeroStrategy::optimizer_steps() const { return optimizer_->step_count(); }
void ZeroStrategy::set_optimizer_steps(int64_t steps) { optimizer_->set_step_count(steps); }

}  // namespace kolos::zero
