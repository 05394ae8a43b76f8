// dp: data parallelism for any model — the default "gradients" plugin.
//
// Gradients live in flat buckets (about `parallel.bucket_mb` each, the first
// at most 1 MiB, filled in reverse parameter order, which is roughly the order backward produces
// them); every parameter's .grad is a view into its bucket, so autograd
// accumulates micro-batches in place. On the last micro-batch of a step a
// post-hook on each parameter's gradient accumulator counts the bucket's
// parameters as they finish; a full bucket's all_reduce (average over the
// dp×sp group) is started at once on the group's communication thread and
// overlaps the rest of backward. Buckets are launched strictly in index
// order, so every rank enqueues the same collectives in the same order even
// if hooks fire in a different order; finish_backward() launches any bucket
// whose parameters got no gradient and waits for all of them. Accumulation
// micro-batches communicate nothing.
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <vector>

#include "kolos/core/error.h"
#include "kolos/core/grad_hooks.h"
#include "kolos/core/gradients.h"
#include "kolos/core/mesh.h"
#include "kolos/core/optimizer.h"
#include "kolos/core/plugin.h"

namespace kolos {
namespace {

struct Bucket {
  at::Tensor buffer;
  std::vector<size_t> params;
  size_t pending = 0;  // parameters not yet ready in this backward
  bool launched = false;
  comm::WorkPtr work;
};

class DataParallel : public GradientStrategy {
 public:
  std::string name() const override { return "dp"; }

  void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) override {
    model_ = &model;
    group_ = mesh.group(AxisSet{Axis::kDP, Axis::kSP});
    for (auto& p : model.placed_parameters()) {
      if (p.tensor.requires_grad()) params_.push_back(p);
    }
    const int64_t bucket_bytes = config.parallel.bucket_kb > 0
                                     ? config.parallel.bucket_kb * 1024
                                     : config.parallel.bucket_mb * 1024 * 1024;
    build_buckets(std::max<int64_t>(1, bucket_bytes));
    if (group_->size() > 1) install_hooks();

    optimizer_ = std::make_unique<AdamW>(adamw_settings(config.optim));
    for (auto& p : params_) optimizer_->add(p.name, p.tensor, p.tensor.grad(), p.placement);
  }

  void zero_grad() override {
    for (auto& b : buckets_) b.buffer.zero_();
  }

  void prepare_backward(bool sync) override {
    sync_ = sync;
    if (!sync) return;
    for (auto& b : buckets_) {
      b.pending = b.params.size();
      b.launched = false;
      b.work.reset();
    }
    next_launch_ = 0;
  }

  void finish_backward() override {
    if (group_->size() == 1) return;
    KOLOS_CHECK(sync_, "dp: finish_backward() after a backward that was not the step's last");
    launch_ready(/*force=*/true);
    for (auto& b : buckets_) b.work->wait();
  }

  std::vector<GradPiece> grad_pieces() override {
    std::vector<GradPiece> pieces;
    for (auto& p : params_) pieces.push_back(GradPiece{p.tensor.grad(), p.placement});
    return pieces;
  }

  void step(double lr) override { optimizer_->step(lr); }

  std::vector<StatePiece> optimizer_state() override { return optimizer_->state_pieces(); }
  int64_t optimizer_steps() const override { return optimizer_->step_count(); }
  void set_optimizer_steps(int64_t steps) override { optimizer_->set_step_count(steps); }

  MemoryStats memory() const override {
    MemoryStats m;
    for (const auto& p : params_) m.parameter_bytes += p.tensor.numel() * p.tensor.element_size();
    for (const auto& b : buckets_) m.gradient_bytes += b.buffer.numel() * b.buffer.element_size();
    m.optimizer_bytes = optimizer_->state_bytes();
    return m;
  }

 private:
  void build_buckets(int64_t bucket_bytes) {
    bucket_of_.assign(params_.size(), 0);
    std::vector<size_t> current;
    int64_t bytes = 0;
    auto flush = [&] {
      if (current.empty()) return;
      const auto options = params_[current.front()].tensor.options().requires_grad(false);
      int64_t numel = 0;
      for (size_t i : current) numel += params_[i].tensor.numel();
      Bucket bucket;
      bucket.buffer = torch::zeros({numel}, options);
      int64_t offset = 0;
      for (size_t i : current) {
        at::Tensor& t = params_[i].tensor;
        t.mutable_grad() = bucket.buffer.narrow(0, offset, t.numel()).view(t.sizes());
        offset += t.numel();
        bucket_of_[i] = buckets_.size();
      }
      bucket.params = current;
      buckets_.push_back(std::move(bucket));
      current.clear();
      bytes = 0;
    };
    // The first bucket (the last parameters, ready first) is small, as in
    // PyTorch DDP, so that communication starts early in backward.
    constexpr int64_t kFirstBucketBytes = 1 << 20;
    for (size_t k = params_.size(); k-- > 0;) {
      const at::Tensor& t = params_[k].tensor;
      const int64_t limit = buckets_.empty() ? std::min(bucket_bytes, kFirstBucketBytes) : bucket_bytes;
      if (!current.empty() && (params_[current.front()].tensor.dtype() != t.dtype() ||
                               bytes + t.numel() * t.element_size() > limit)) {
        flush();
      }
      current.push_back(k);
      bytes += t.numel() * t.element_size();
    }
    flush();
  }

  void install_hooks() {
    for (size_t i = 0; i < params_.size(); ++i) {
      accumulators_.push_back(
          on_grad_accumulated(params_[i].tensor, params_[i].name, [this, i] { on_ready(i); }));
    }
  }

  void on_ready(size_t index) {
    if (!sync_) return;
    Bucket& b = buckets_[bucket_of_[index]];
    if (b.pending > 0) --b.pending;
    launch_ready(/*force=*/false);
  }

  // Launches buckets in index order while they are complete (or all, when
  // forced at the end of backward).
  void launch_ready(bool force) {
    while (next_launch_ < buckets_.size()) {
      Bucket& b = buckets_[next_launch_];
      if (!force && b.pending > 0) break;
      b.work = group_->all_reduce(b.buffer, comm::ReduceOp::kAvg);
      b.launched = true;
      ++next_launch_;
    }
  }

  comm::ProcessGroupPtr group_;
  std::vector<PlacedParameter> params_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::unique_ptr<AdamW> optimizer_;
  size_t next_launch_ = 0;
  bool sync_ = true;
};

}  // namespace
}  // namespace kolos

KOLOS_DEFINE_PLUGIN("dp", "gradients", kolos::GradientStrategy, kolos::DataParallel,
                    "data parallelism: bucketed all-reduce overlapped with backward")
