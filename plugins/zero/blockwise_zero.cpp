// ZeRO stage 3 (see blockwise_zero.h).
#include "blockwise_zero.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>

#include "kolos/core/error.h"
#include "kolos/core/grad_hooks.h"
#include "kolos/core/mesh.h"
#include "kolos/core/settings.h"
#include "kolos/core/tensor_storage.h"

namespace kolos::zero {
namespace {

// Reductions launched but not yet completed (besides the block being filled):
// bounds the unsharded gradient staging a rank holds (FSDP's rate limiter).
constexpr size_t kMaxReductionsInFlight = 1;

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

BlockwiseZero::~BlockwiseZero() {
  // Reductions or gathers still queued (an exception mid-step) must finish
  // before the buffers they use go away; never throw from here.
  try {
    for (auto& r : in_flight_) r.work->wait();
    for (auto& b : blocks_) {
      if (b.gather_work) b.gather_work->wait();
    }
  } catch (...) {
  }
  // The model's block hooks point here, but the model is not touched: the
  // engine destroys it first (a model outliving its strategy must not run).
}

void BlockwiseZero::configure(const PluginContext& context) {
  struct Settings {
    bool reshard_after_forward = true;
  } settings;
  SettingsTable<Settings>("parallel.zero")
      .boolean("reshard_after_forward", &Settings::reshard_after_forward)
      .read(context.section, settings, context.core_keys, context.owner);
  reshard_after_forward_ = settings.reshard_after_forward;
}

BlockBuilt BlockwiseZero::placement_at_build(const DeviceMesh& mesh) {
  return [this, &mesh](const std::vector<PlacedParameter>& parameters) {
    keep_built_rows(parameters, mesh);
  };
}

void BlockwiseZero::setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) {
  reduce_in_fp32_ = reduce_in_fp32(config);
  shard_parameters(model, mesh);
  for (const auto& s : slots_) {
    // Those built into place were checked then, before their memory was freed.
    if (!built_rows_.count(s.param.tensor.unsafeGetTensorImpl())) check_owns_storage(s.param);
  }
  // One group per block and domain (group b * domains + d), so that a
  // block's parameters come in one gather per group of ranks they are
  // sharded over (one, unless the block has experts under ep).
  const size_t domains = domains_.size();
  std::vector<std::vector<size_t>> members(model.blocks().size() * domains);
  for (size_t i = 0; i < slots_.size(); ++i) {
    members.at(slots_[i].param.block * domains + slots_[i].domain).push_back(i);
  }
  build_groups(members);
  blocks_.resize(groups_.size());
  make_optimizer(config);
  for (size_t i = 0; i < slots_.size(); ++i) {
    accumulators_.push_back(on_grad_accumulated(slots_[i].param.tensor, slots_[i].param.name,
                                                [this, i] { on_grad_ready(i); }));
  }
  find_block_uses(config);
  // Reuse keeps up to four rank-major buffers of the largest group: its
  // gather buffer, its parameters and its gradient staging, and the
  // prefetched group's gather.
  for (const auto& g : groups_) {
    if (g.slots.empty()) continue;
    const int64_t bytes = domains_[g.domain].ranks * g.shard_numel *
                          static_cast<int64_t>(g.shard_params.element_size());
    reuse_.limit = std::max(reuse_.limit, 4 * bytes);
  }
  for (auto& b : blocks_) b.state = GatherState::kGathered;
  free_all_groups();
  gathered_now_ = gathered_peak_ = 0;
  install_block_hooks();
  // The whole parameters the model was built with are freed now: their
  // pages go back to the kernel rather than staying in malloc's heap, where
  // they would count in the process's resident memory while training.
  malloc_trim(0);
}

// ---- one step ---------------------------------------------------------------

void BlockwiseZero::zero_grad() {
  torch::NoGradGuard no_grad;
  free_all_groups();  // left gathered by a forward without backward
  gathered_peak_ = gathered_now_;
  staging_peak_ = staging_now_;
  gather_stats_ = GatherStats();
  for (auto& g : groups_) {
    if (g.shard_grads.defined()) g.shard_grads.zero_();
  }
}

void BlockwiseZero::prepare_backward(bool) {
  if (backward_open_) close_micro_batch();
  for (size_t g = 0; g < groups_.size(); ++g) blocks_[g].pending = groups_[g].slots.size();
  next_launch_ = 0;
  backward_open_ = true;
}

void BlockwiseZero::on_grad_ready(size_t index) {
  if (!backward_open_) return;
  Slot& s = slots_[index];
  Block& b = blocks_[s.group];
  torch::NoGradGuard no_grad;
  at::Tensor& grad = s.param.tensor.mutable_grad();
  if (grad.defined()) {
    if (!b.staging.defined()) {
      const ShardGroup& g = groups_[s.group];
      b.staging = take_buffer(domains_[g.domain].ranks * g.shard_numel, grad.options()).zero_();
      track(staging_now_, staging_peak_, bytes_of(b.staging));
    }
    scatter_rows(s, grad, b.staging);
    grad.reset();  // no whole gradient outlives its micro-batch
  }
  if (b.pending > 0 && --b.pending == 0) {
    free_group(s.group);  // every parameter of the block has its gradient: reshard
  }
  launch_ready(/*force=*/false);
}

// Launches reductions from the last block to the first while blocks are
// complete (all of them when forced at the end of a micro-batch), so that
// every rank enqueues the same collectives in the same order.
void BlockwiseZero::launch_ready(bool force) {
  while (next_launch_ < groups_.size()) {
    const size_t index = groups_.size() - 1 - next_launch_;
    ShardGroup& g = groups_[index];
    Block& b = blocks_[index];
    if (!g.slots.empty()) {
      if (!force && b.pending > 0) break;
      const Domain& d = domains_[g.domain];
      if (!b.staging.defined()) {  // no gradient reached this block: reduce zeros
        b.staging = take_buffer(d.ranks * g.shard_numel, g.shard_grads.options()).zero_();
        track(staging_now_, staging_peak_, bytes_of(b.staging));
      }
      // train.reduce_dtype = "fp32": the bf16/fp16 staging widened for the
      // collective; the shard's gradient receives the fp32 result rounded once.
      at::Tensor input = reduce_in_fp32_ ? b.staging.to(at::kFloat) : b.staging;
      track(staging_now_, staging_peak_, bytes_of(input) - bytes_of(b.staging));
      at::Tensor out = torch::empty({g.shard_numel}, input.options());
      comm::WorkPtr work = d.group->reduce_scatter_flat(out, input, comm::ReduceOp::kAvg);
      in_flight_.push_back(Reduction{index, input, out, std::move(work)});
      b.staging = at::Tensor();
      while (in_flight_.size() > kMaxReductionsInFlight) complete_oldest();
    }
    ++next_launch_;
  }
}

void BlockwiseZero::complete_oldest() {
  Reduction r = std::move(in_flight_.front());
  in_flight_.pop_front();
  r.work->wait();
  torch::NoGradGuard no_grad;
  groups_[r.group].shard_grads.add_(r.output);
  track(staging_now_, staging_peak_, -bytes_of(r.input));
  give_buffer(r.input);
}

void BlockwiseZero::close_micro_batch() {
  launch_ready(/*force=*/true);
  free_all_groups();
  backward_open_ = false;
}

void BlockwiseZero::finish_backward() {
  if (backward_open_) close_micro_batch();
  while (!in_flight_.empty()) complete_oldest();
  torch::NoGradGuard no_grad;
  for (auto& g : groups_) {
    const double factor = domains_[g.domain].factor;
    if (factor != 1.0 && g.shard_grads.defined()) g.shard_grads.mul_(factor);
  }
}

void BlockwiseZero::step(double lr) { optimizer_->step(lr); }

// ---- parameters gathered block by block ---------------------------------------

// Which groups each block reads. A block owns the parameters registered
// under it, but may read others' (GPT's head reads the token embedding of
// the "embed" block: tied weights). One probe forward at set-up, on a batch
// of one sequence of token 0 with every parameter still whole, walks each
// block's autograd graph back to its input and collects the parameters it
// reached. The RNG is restored afterwards so training draws what it would
// have drawn without the probe.
void BlockwiseZero::find_block_uses(const RunConfig& config) {
  const size_t blocks = model_->blocks().size();
  uses_.assign(blocks, {});
  const size_t domains = domains_.size();
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t d = 0; d < domains; ++d) {
      if (!groups_[b * domains + d].slots.empty()) uses_[b].push_back(b * domains + d);
    }
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

void BlockwiseZero::install_block_hooks() {
  BlockHooks hooks;
  hooks.before_forward = [this](size_t block, const at::Tensor&) { before_forward(block); };
  hooks.after_forward = [this](size_t block, const at::Tensor& output) {
    after_forward(block, output);
  };
  model_->set_block_hooks(std::move(hooks));
}

void BlockwiseZero::before_forward(size_t block) {
  for (size_t g : uses_[block]) start_gather(g);
  for (size_t g : uses_[block]) finish_gather(g);
  // Prefetch: the next block's gather runs while this block computes.
  if (block + 1 < uses_.size()) {
    for (size_t g : uses_[block + 1]) start_gather(g, true);
  }
}

void BlockwiseZero::after_forward(size_t block, const at::Tensor& output) {
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

void BlockwiseZero::before_backward(size_t block) {
  for (size_t g : uses_[block]) start_gather(g);
  for (size_t g : uses_[block]) finish_gather(g);
  if (block > 0) {
    for (size_t g : uses_[block - 1]) start_gather(g, true);
  }
}

void BlockwiseZero::start_gather(size_t index, bool ahead) {
  ShardGroup& g = groups_[index];
  Block& b = blocks_[index];
  if (g.slots.empty() || b.state != GatherState::kFree) return;
  const Domain& d = domains_[g.domain];
  b.gather_out = take_buffer(d.ranks * g.shard_numel, g.shard_params.options());
  gather_stats_.bytes += bytes_of(b.gather_out);
  if (ahead) gather_stats_.bytes_ahead += bytes_of(b.gather_out);
  track(gathered_now_, gathered_peak_, bytes_of(b.gather_out));
  b.gather_work = d.group->all_gather_flat(b.gather_out, g.shard_params);
  b.state = GatherState::kGathering;
}

void BlockwiseZero::finish_gather(size_t index) {
  ShardGroup& g = groups_[index];
  Block& b = blocks_[index];
  if (g.slots.empty() || b.state == GatherState::kGathered) return;
  if (b.state == GatherState::kFree) start_gather(index);
  const auto start = std::chrono::steady_clock::now();
  b.gather_work->wait();
  gather_stats_.wait_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  b.gather_work.reset();
  torch::NoGradGuard no_grad;
  for (size_t i : g.slots) {
    Slot& s = slots_[i];
    allocate_reused(s.param.tensor);
    track(gathered_now_, gathered_peak_, s.bytes());
    gather_rows(s, b.gather_out, alias_of(s.param.tensor));
  }
  track(gathered_now_, gathered_peak_, -bytes_of(b.gather_out));
  give_buffer(b.gather_out);
  b.state = GatherState::kGathered;
}

void BlockwiseZero::free_group(size_t index) {
  ShardGroup& g = groups_[index];
  Block& b = blocks_[index];
  if (b.state == GatherState::kGathering) {
    b.gather_work->wait();  // its buffer is in use until then
    b.gather_work.reset();
    track(gathered_now_, gathered_peak_, -bytes_of(b.gather_out));
    give_buffer(b.gather_out);
  } else if (b.state == GatherState::kGathered) {
    for (size_t i : g.slots) {
      free_reused(slots_[i].param.tensor);
      track(gathered_now_, gathered_peak_, -slots_[i].bytes());
    }
  }
  b.state = GatherState::kFree;
}

at::DataPtr BlockwiseZero::Reuse::take(size_t bytes, c10::Allocator* allocator) {
  auto it = free.find(bytes);
  if (it == free.end() || it->second.empty()) return allocator->allocate(bytes);
  at::DataPtr data = std::move(it->second.back());
  it->second.pop_back();
  kept -= static_cast<int64_t>(bytes);
  return data;
}

void BlockwiseZero::Reuse::give(size_t bytes, at::DataPtr data) {
  if (!data || kept + static_cast<int64_t>(bytes) > limit) return;  // freed here
  kept += static_cast<int64_t>(bytes);
  free[bytes].push_back(std::move(data));
}

void BlockwiseZero::allocate_reused(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(s->device().is_cpu() ? reuse_.take(nbytes, s->allocator())
                                              : s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

void BlockwiseZero::free_reused(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = s->nbytes();
  at::DataPtr data = s->set_data_ptr(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
  // Device memory goes back to its caching allocator, which reuses it
  // knowing which streams still use it; only host memory is kept here.
  if (data.device().is_cpu()) reuse_.give(nbytes, std::move(data));
}

at::Tensor BlockwiseZero::take_buffer(int64_t numel, const at::TensorOptions& options) {
  if (!options.device().is_cpu()) return torch::empty({numel}, options);  // see free_reused
  const size_t nbytes =
      static_cast<size_t>(numel) * c10::elementSize(options.dtype().toScalarType());
  c10::Allocator* allocator = c10::GetAllocator(options.device().type());
  at::DataPtr data = reuse_.take(nbytes, allocator);
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                       std::move(data), allocator, false);
  return at::empty({0}, options).set_(at::Storage(std::move(storage)), 0, {numel}, {1});
}

void BlockwiseZero::give_buffer(at::Tensor& t) {
  if (t.defined() && t.use_count() == 1 && t.storage().use_count() == 1) {
    free_reused(t);
  }
  t = at::Tensor();
}

void BlockwiseZero::free_all_groups() {
  for (size_t g = 0; g < groups_.size(); ++g) free_group(g);
}

// ---- state and accounting ----------------------------------------------------

MemoryStats BlockwiseZero::memory() const {
  MemoryStats m = shard_memory();
  // Transients at their high-water mark of the last step: gathered
  // parameters with their gather buffers, and unsharded gradient staging.
  m.parameter_bytes += gathered_peak_;
  m.gradient_bytes += staging_peak_;
  return m;
}

std::vector<PlacedParameter> BlockwiseZero::parameters_at_rest() {
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

}  // namespace kolos::zero
