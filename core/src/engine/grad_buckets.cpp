// The gradient-bucket engine (see grad_buckets.h for the protocol).
#include "kolos/core/grad_buckets.h"

#include <torch/torch.h>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>

#include "kolos/core/error.h"
#include "kolos/core/grad_hooks.h"

namespace kolos {
namespace {

int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

std::vector<int64_t> packed_strides(at::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;)
    strides[d - 1] = strides[d] * std::max<int64_t>(1, sizes[d]);
  return strides;
}

}  // namespace

struct GradBuckets::Impl {
  struct Layout {  // kReduceScatter: the parameter cut along dim 0 into N chunks
    int64_t rows = 0, row_numel = 1, chunk = 0;
    int64_t rows_of(int64_t r) const {
      const int64_t begin = std::min(rows, r * chunk);
      return std::min(rows, begin + chunk) - begin;
    }
  };
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;  // kAllReduce: into buffer; kReduceScatter: into the shard S
    int64_t numel = 0;             // kAllReduce: whole gradients; kReduceScatter: S
    at::Tensor buffer;             // kAllReduce: the whole gradients, .grad tensors over it
    at::Tensor staging;            // kReduceScatter: [N * S], this micro-batch
    size_t pending = 0;
  };
  struct Reduction {
    size_t bucket;
    at::Tensor input, output;
    comm::WorkPtr work;
  };

  std::vector<Param> params;
  std::vector<Layout> layouts;
  comm::ProcessGroupPtr group;
  // kAllReduce: what buckets are all-reduced on (group, or a hierarchical
  // group over it), and why.
  comm::AllReduceChoice choice;
  Options options;
  int64_t ranks = 1, rank = 0;
  bool reduce_scatter = false;

  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;
  std::vector<int64_t> offset_of;  // the parameter's offset in its bucket
  std::vector<GradAccumulatorPtr> accumulators;
  std::deque<Reduction> in_flight;
  size_t next_launch = 0;
  bool sync = true;
  bool backward_open = false;
  bool finishing = false;  // inside finish_backward()
  // Bytes launched by the latest hook: if it was the backward's last, they
  // were launched with no backward left to overlap.
  int64_t latest_hook_bytes = 0;

  // Ready order: recorded during the first step, agreed at its end, applied
  // at the next zero_grad().
  bool recording = true;
  std::vector<char> seen;
  std::vector<size_t> ready_order;
  std::vector<size_t> agreed_order;
  bool rebuilt = false;

  ReductionStats step_stats, last_stats;
  int64_t staging_now = 0, staging_peak = 0;

  void build(const std::vector<size_t>& order);
  void choose_all_reduce();
  void point_grads_at_buffers();
  void on_ready(size_t index);
  void launch_ready(bool force);
  void launch(size_t index, bool from_hook);
  // `t` in fp32 when options.reduce_in_fp32 (a copy), else `t` itself.
  at::Tensor widened(const at::Tensor& t) const;
  void complete_oldest();
  void close_micro_batch();
  std::vector<size_t> agree_on_order();
  void scatter_rows(size_t param, const Bucket& b, const at::Tensor& grad) const;
  void track(int64_t delta) {
    staging_now += delta;
    staging_peak = std::max(staging_peak, staging_now);
  }
};

GradBuckets::GradBuckets(std::vector<Param> params, comm::ProcessGroupPtr group, Options options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.params = std::move(params);
  s.group = std::move(group);
  s.options = options;
  s.ranks = s.group->size();
  s.rank = s.group->rank();
  s.reduce_scatter = options.reduction == Reduction::kReduceScatter;
  s.options.bucket_bytes = std::max<int64_t>(1, options.bucket_bytes);
  s.options.first_bucket_bytes = std::max<int64_t>(1, options.first_bucket_bytes);
  s.recording = options.rebuild_in_ready_order;
  s.seen.assign(s.params.size(), 0);
  s.layouts.resize(s.params.size());
  for (size_t i = 0; i < s.params.size(); ++i) {
    const at::Tensor& t = s.params[i].tensor;
    KOLOS_CHECK(t.requires_grad(), "gradient buckets: parameter ", s.params[i].name,
                " does not require grad");
    if (!s.reduce_scatter) continue;
    KOLOS_CHECK(t.dim() >= 1, "gradient buckets: parameter ", s.params[i].name,
                " is a scalar; reduce-scatter cuts along dim 0");
    Impl::Layout& l = s.layouts[i];
    l.rows = t.size(0);
    l.row_numel = l.rows > 0 ? t.numel() / l.rows : 0;
    l.chunk = (l.rows + s.ranks - 1) / s.ranks;
    const at::Tensor& shard = s.params[i].shard_grad;
    KOLOS_CHECK(shard.defined() && shard.is_contiguous() && shard.numel() == l.chunk * l.row_numel,
                "gradient buckets: parameter ", s.params[i].name,
                " needs a contiguous shard_grad of ", l.chunk * l.row_numel, " elements");
  }
  std::vector<size_t> reversed(s.params.size());
  for (size_t i = 0; i < reversed.size(); ++i) reversed[i] = reversed.size() - 1 - i;
  s.build(reversed);
  s.choice.group = s.group;
  if (!s.reduce_scatter && s.ranks > 1 && options.allreduce != comm::AllReduceMode::kFlat) {
    s.choose_all_reduce();
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.accumulators.push_back(on_grad_accumulated(s.params[i].tensor, s.params[i].name,
                                                 [this, i] { impl_->on_ready(i); }));
  }
}

GradBuckets::~GradBuckets() {
  try {
    for (auto& r : impl_->in_flight) r.work->wait();
  } catch (...) {
  }
}

// The path for the buckets, chosen on a sample of the largest bucket (in
// the dtype it is reduced in); rank 0 of the world logs it.
void GradBuckets::Impl::choose_all_reduce() {
  torch::NoGradGuard no_grad;
  // The bytes a bucket is reduced in (widened to fp32 under reduce_in_fp32).
  const auto reduced_bytes = [this](const at::Tensor& t) {
    return options.reduce_in_fp32 ? t.numel() * int64_t{4} : bytes_of(t);
  };
  const Bucket* largest = nullptr;
  for (const auto& b : buckets) {
    if (largest == nullptr || reduced_bytes(b.buffer) > reduced_bytes(largest->buffer)) {
      largest = &b;
    }
  }
  at::Tensor sample = torch::empty({1}, torch::kFloat);
  if (largest != nullptr) {
    const at::Tensor& buffer = largest->buffer;
    sample = torch::empty({buffer.numel()}, buffer.options().dtype(options.reduce_in_fp32
                                                                        ? at::kFloat
                                                                        : buffer.scalar_type()));
  }
  choice = comm::choose_all_reduce(group, options.allreduce, sample);
  if (choice.nodes > 1 || choice.path == "hierarchical") {
    step_stats.all_reduce_path = last_stats.all_reduce_path = choice.path;
    step_stats.all_reduce_json = last_stats.all_reduce_json = choice.json();
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (world_rank == 0) std::fprintf(stderr, "kolos: %s\n", choice.describe().c_str());
  }
}

void GradBuckets::Impl::build(const std::vector<size_t>& order) {
  torch::NoGradGuard no_grad;
  std::vector<Bucket> built;
  bucket_of.assign(params.size(), 0);
  offset_of.assign(params.size(), 0);
  Bucket current;
  int64_t bytes = 0;
  auto flush = [&] {
    if (current.params.empty()) return;
    built.push_back(std::move(current));
    current = Bucket();
    bytes = 0;
  };
  for (size_t i : order) {
    const at::Tensor& t = params[i].tensor;
    const int64_t limit = built.empty() ? std::min(options.bucket_bytes, options.first_bucket_bytes)
                                        : options.bucket_bytes;
    if (!current.params.empty() && (params[current.params.front()].tensor.dtype() != t.dtype() ||
                                    bytes + bytes_of(t) > limit)) {
      flush();
    }
    const int64_t numel = reduce_scatter ? layouts[i].chunk * layouts[i].row_numel : t.numel();
    bucket_of[i] = built.size();
    offset_of[i] = current.numel;
    current.params.push_back(i);
    current.offsets.push_back(current.numel);
    current.numel += numel;
    bytes += bytes_of(t);
  }
  flush();
  if (!reduce_scatter) {
    for (auto& b : built) {
      b.buffer =
          torch::zeros({b.numel}, params[b.params.front()].tensor.options().requires_grad(false));
    }
  }
  buckets = std::move(built);
  if (!reduce_scatter) point_grads_at_buffers();
}

// Every .grad is a plain (non-view) tensor over its bucket's storage; the
// first build creates it, a rebuild re-points the same TensorImpl, so every
// holder of the tensor (an optimizer slot) sees the new buffer.
void GradBuckets::Impl::point_grads_at_buffers() {
  for (const auto& b : buckets) {
    for (size_t k = 0; k < b.params.size(); ++k) {
      at::Tensor& t = params[b.params[k]].tensor;
      at::Tensor& grad = t.mutable_grad();
      if (!grad.defined()) grad = at::empty({0}, b.buffer.options());
      grad.set_(b.buffer.storage(), b.offsets[k], t.sizes(), packed_strides(t.sizes()));
    }
  }
}

void GradBuckets::zero_grad() {
  Impl& s = *impl_;
  torch::NoGradGuard no_grad;
  if (!s.agreed_order.empty()) {
    s.build(s.agreed_order);
    s.agreed_order.clear();
    s.rebuilt = true;
  }
  for (auto& b : s.buckets) {
    if (b.buffer.defined()) b.buffer.zero_();
  }
  s.staging_peak = s.staging_now;
  s.step_stats = ReductionStats();
  s.step_stats.all_reduce_path = s.last_stats.all_reduce_path;
  s.step_stats.all_reduce_json = s.last_stats.all_reduce_json;
}

void GradBuckets::prepare_backward(bool sync) {
  Impl& s = *impl_;
  if (s.backward_open) s.close_micro_batch();
  s.sync = sync;
  if (!s.reduce_scatter && !sync) return;  // accumulation: summed in place, no communication
  for (auto& b : s.buckets) b.pending = b.params.size();
  s.next_launch = 0;
  s.backward_open = true;
}

void GradBuckets::Impl::on_ready(size_t index) {
  if (recording && !seen[index]) {
    seen[index] = 1;
    ready_order.push_back(index);
  }
  if (!backward_open) return;
  latest_hook_bytes = 0;
  Bucket& b = buckets[bucket_of[index]];
  if (reduce_scatter) {
    torch::NoGradGuard no_grad;
    at::Tensor& grad = params[index].tensor.mutable_grad();
    if (grad.defined()) {
      if (!b.staging.defined()) {
        b.staging = torch::zeros({ranks * b.numel}, grad.options());
        track(bytes_of(b.staging));
      }
      scatter_rows(index, b, grad);
      grad.reset();  // no whole gradient outlives its micro-batch
    }
  }
  if (b.pending > 0) --b.pending;
  launch_ready(/*force=*/false);
}

void GradBuckets::Impl::launch_ready(bool force) {
  while (next_launch < buckets.size()) {
    if (!force && buckets[next_launch].pending > 0) break;
    launch(next_launch, /*from_hook=*/!force);
    ++next_launch;
  }
}

at::Tensor GradBuckets::Impl::widened(const at::Tensor& t) const {
  if (!options.reduce_in_fp32 || t.scalar_type() == at::kFloat) return t;
  torch::NoGradGuard no_grad;
  return t.to(at::kFloat);
}

void GradBuckets::Impl::launch(size_t index, bool from_hook) {
  Bucket& b = buckets[index];
  if (reduce_scatter) {
    if (!b.staging.defined()) {  // no gradient reached this bucket: reduce zeros
      b.staging = torch::zeros({ranks * b.numel}, params[b.params.front()].shard_grad.options());
      track(bytes_of(b.staging));
    }
    at::Tensor input = widened(b.staging);
    track(bytes_of(input) - bytes_of(b.staging));  // the staging is freed below
    at::Tensor out = torch::empty({b.numel}, input.options());
    comm::WorkPtr work = group->reduce_scatter_flat(out, input, comm::ReduceOp::kAvg);
    in_flight.push_back(Reduction{index, input, out, std::move(work)});
    b.staging = at::Tensor();
  } else {
    if (ranks == 1) return;  // nothing to average
    at::Tensor input = widened(b.buffer);
    // A widened copy is reduced, then rounded back into the bucket.
    at::Tensor copy_back = input.is_same(b.buffer) ? at::Tensor() : input;
    in_flight.push_back(
        Reduction{index, b.buffer, copy_back, choice.group->all_reduce(input, comm::ReduceOp::kAvg)});
  }
  const int64_t bytes = bytes_of(in_flight.back().input);
  step_stats.bytes += bytes;
  if (from_hook) {
    step_stats.bytes_during_backward += bytes;
    latest_hook_bytes += bytes;
  }
  ++step_stats.reductions;
  // Bound the unsharded staging: one reduction in flight besides the bucket
  // being filled (FSDP's rate limiter).
  while (reduce_scatter && in_flight.size() > 1) {
    complete_oldest();
    if (!finishing) ++step_stats.completed_before_finish;
  }
}

void GradBuckets::Impl::complete_oldest() {
  Reduction r = std::move(in_flight.front());
  in_flight.pop_front();
  r.work->wait();
  torch::NoGradGuard no_grad;
  if (!reduce_scatter) {
    if (r.output.defined()) r.input.copy_(r.output);  // fp32 reduction, rounded back
    return;
  }
  const Bucket& b = buckets[r.bucket];
  for (size_t k = 0; k < b.params.size(); ++k) {
    const Param& p = params[b.params[k]];
    p.shard_grad.view({-1}).add_(r.output.narrow(0, b.offsets[k], p.shard_grad.numel()));
  }
  track(-bytes_of(r.input));
}

void GradBuckets::Impl::close_micro_batch() {
  step_stats.bytes_during_backward -= latest_hook_bytes;
  latest_hook_bytes = 0;
  launch_ready(/*force=*/true);
  backward_open = false;
}

void GradBuckets::finish_backward() {
  Impl& s = *impl_;
  const auto start = std::chrono::steady_clock::now();
  // What finished on its own while backward ran: observed, not inferred.
  for (const auto& r : s.in_flight) {
    if (r.work->is_completed()) ++s.step_stats.completed_before_finish;
  }
  s.finishing = true;
  if (s.backward_open) s.close_micro_batch();
  while (!s.in_flight.empty()) s.complete_oldest();
  s.finishing = false;
  s.step_stats.wait_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  s.last_stats = s.step_stats;
  if (s.recording) {
    s.recording = false;
    s.agreed_order = s.agree_on_order();
  }
}

// Rank 0's order, broadcast over the group, so that every rank rebuilds the
// same buckets. Parameters that never became ready go last, reversed.
std::vector<size_t> GradBuckets::Impl::agree_on_order() {
  std::vector<size_t> order = ready_order;
  for (size_t i = params.size(); i-- > 0;) {
    if (!seen[i]) order.push_back(i);
  }
  if (ranks > 1) {
    at::Tensor t = torch::empty({static_cast<int64_t>(order.size())}, torch::kInt64);
    auto* data = t.data_ptr<int64_t>();
    for (size_t i = 0; i < order.size(); ++i) data[i] = static_cast<int64_t>(order[i]);
    group->broadcast(t, 0)->wait();
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<size_t>(data[i]);
  }
  ready_order.clear();
  seen.clear();
  return order;
}

void GradBuckets::Impl::scatter_rows(size_t param, const Bucket& b, const at::Tensor& grad) const {
  const Layout& l = layouts[param];
  const int64_t offset = offset_of[param];
  at::Tensor src = grad.reshape({l.rows, l.row_numel});
  at::Tensor dst = b.staging.view({ranks, b.numel});
  for (int64_t r = 0; r < ranks; ++r) {
    const int64_t n = l.rows_of(r);
    if (n <= 0) continue;
    dst[r]
        .narrow(0, offset, n * l.row_numel)
        .view({n, l.row_numel})
        .copy_(src.narrow(0, r * l.chunk, n));
  }
}

ReductionStats GradBuckets::stats() const { return impl_->last_stats; }

const comm::AllReduceChoice& GradBuckets::all_reduce_choice() const { return impl_->choice; }

std::vector<std::vector<std::string>> GradBuckets::buckets() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : impl_->buckets) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(impl_->params[i].name);
  }
  return out;
}

bool GradBuckets::rebuilt() const { return impl_->rebuilt; }

int64_t GradBuckets::gradient_bytes() const {
  int64_t total = 0;
  for (const auto& b : impl_->buckets) total += bytes_of(b.buffer);
  return total;
}

int64_t GradBuckets::staging_peak_bytes() const { return impl_->staging_peak; }

}  // namespace kolos
