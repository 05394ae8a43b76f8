// ZeRO stages 1 and 2 (see bucketed_zero.h).
#include "bucketed_zero.h"

#include <torch/torch.h>

#include <deque>

#include "kolos/core/error.h"
#include "kolos/core/mesh.h"

namespace kolos::zero {
namespace {
// Parameter all-gathers after a step kept in flight at once.
constexpr size_t kMaxGathersInFlight = 2;
}  // namespace

BucketedZero::BucketedZero(int stage) : ZeroStrategy(stage), whole_grads_(stage == 1) {
  KOLOS_CHECK(stage == 1 || stage == 2, "BucketedZero serves ZeRO stages 1 and 2, not ", stage);
}

void BucketedZero::setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) {
  shard_parameters(model, mesh);
  const int64_t bucket_bytes =
      std::max<int64_t>(1, config.parallel.bucket_kb > 0 ? config.parallel.bucket_kb * 1024
                                                         : config.parallel.bucket_mb * 1024 * 1024);

  // Shard groups of about a bucket each, in parameter order: the unit of
  // the all-gather after the step.
  std::vector<std::vector<size_t>> members;
  int64_t bytes = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const at::Tensor& t = slots_[i].param.tensor;
    if (members.empty() || slots_[members.back().front()].param.tensor.dtype() != t.dtype() ||
        slots_[members.back().front()].domain != slots_[i].domain ||
        bytes + bytes_of(t) > bucket_bytes) {
      members.emplace_back();
      bytes = 0;
    }
    members.back().push_back(i);
    bytes += bytes_of(t);
  }
  build_groups(members);
  make_optimizer(config);

  std::vector<std::vector<GradBuckets::Param>> params(domains_.size());
  for (auto& s : slots_) {
    params[s.domain].push_back(GradBuckets::Param{s.param.name, s.param.tensor,
                                                  whole_grads_ ? at::Tensor() : s.grad_shard});
  }
  GradBuckets::Options options;
  options.reduction =
      whole_grads_ ? GradBuckets::Reduction::kAllReduce : GradBuckets::Reduction::kReduceScatter;
  options.bucket_bytes = bucket_bytes;
  options.reduce_in_fp32 = reduce_in_fp32(config);
  options.allreduce = comm::parse_all_reduce_mode(config.parallel.allreduce);
  for (size_t d = 0; d < domains_.size(); ++d) {
    buckets_.push_back(
        std::make_unique<GradBuckets>(std::move(params[d]), domains_[d].group, options));
  }
}

void BucketedZero::zero_grad() {
  torch::NoGradGuard no_grad;
  gathered_peak_ = gathered_now_;
  for (auto& g : groups_) {
    if (g.shard_grads.defined()) g.shard_grads.zero_();
  }
  for (auto& b : buckets_) b->zero_grad();
  // The whole parameters are the truth at rest (a checkpoint loads into
  // them); the shard the optimizer steps is refreshed from them.
  refresh_masters();
}

void BucketedZero::prepare_backward(bool sync) {
  for (auto& b : buckets_) b->prepare_backward(sync);
}

void BucketedZero::finish_backward() {
  for (auto& b : buckets_) b->finish_backward();
  if (whole_grads_) copy_grad_shards_from_whole();
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    const double factor = domains_[s.domain].factor;
    if (factor != 1.0) s.grad_shard.mul_(factor);
  }
}

void BucketedZero::step(double lr) {
  optimizer_->step(lr);
  gather_params_after_step();
}

void BucketedZero::copy_grad_shards_from_whole() {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    const int64_t index = domains_[s.domain].index;
    const int64_t mine = s.rows_of(index);
    if (mine > 0) {
      s.grad_shard.narrow(0, 0, mine)
          .copy_(s.param.tensor.grad().narrow(0, index * s.chunk, mine));
    }
  }
}

std::vector<PlacedParameter> BucketedZero::parameters_at_rest() {
  std::vector<PlacedParameter> out;
  for (const auto& p : model_->placed_parameters()) {
    auto it = slot_of_impl_.find(p.tensor.unsafeGetTensorImpl());
    if (it == slot_of_impl_.end() || p.tensor.scalar_type() == at::kFloat) {
      out.push_back(p);
      continue;
    }
    const Slot& s = slots_[it->second];
    out.push_back(PlacedParameter{p.name, s.master, s.shard, p.block});
  }
  return out;
}

void BucketedZero::after_load() {
  // Only mixed precision loads into the shards (parameters_at_rest).
  for (const auto& s : slots_) {
    if (s.param.tensor.scalar_type() != at::kFloat) {
      gather_params_after_step();
      return;
    }
  }
}

void BucketedZero::refresh_masters() {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    const int64_t index = domains_[s.domain].index;
    const int64_t mine = s.rows_of(index);
    if (mine > 0) {
      s.master.narrow(0, 0, mine).copy_(s.param.tensor.detach().narrow(0, index * s.chunk, mine));
    }
  }
}

void BucketedZero::gather_params_after_step() {
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
    ShardGroup& g = groups_[index];
    if (g.slots.empty()) continue;
    const Domain& d = domains_[g.domain];
    at::Tensor out = torch::empty({d.ranks * g.shard_numel}, g.shard_params.options());
    track(gathered_now_, gathered_peak_, bytes_of(out));
    pending.push_back(Pending{index, out, d.group->all_gather_flat(out, g.shard_params)});
    if (pending.size() >= kMaxGathersInFlight) drain_one();
  }
  while (!pending.empty()) drain_one();
}

MemoryStats BucketedZero::memory() const {
  MemoryStats m = shard_memory();
  for (const auto& s : slots_) m.parameter_bytes += s.bytes();  // whole, at rest
  // Transients at their high-water mark of the last step: the all-gather
  // buffers after the step and (stage 2) the unsharded gradient staging.
  m.parameter_bytes += gathered_peak_;
  for (const auto& b : buckets_) m.gradient_bytes += b->gradient_bytes() + b->staging_peak_bytes();
  return m;
}

// The whole data group's figures, with the experts' traffic added.
ReductionStats BucketedZero::reduction_stats() const {
  ReductionStats stats = buckets_.front()->stats();
  for (size_t d = 1; d < buckets_.size(); ++d) {
    stats.add(buckets_[d]->stats());
  }
  return stats;
}

}  // namespace kolos::zero
