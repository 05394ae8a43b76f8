// dp: data parallelism for any model — the default "gradients" plugin.
//
// Gradients live in the buckets of the core's bucket engine (GradBuckets,
// kolos/core/grad_buckets.h, all-reduce mode): every parameter's .grad is a
// tensor over its bucket's flat buffer, so autograd accumulates
// micro-batches in place. On the last micro-batch of a step a full bucket's
// all_reduce (average over the dp×sp group) starts from the gradient hook
// that completes it and overlaps the rest of backward; finish_backward()
// launches what is left and waits. Buckets follow the order gradients
// became ready on the first step (agreed over the group). Accumulation
// micro-batches communicate nothing.
//
// A gradient is averaged over the data axes (dp, ep: batch_axes()) and sp
// that its parameter is not held apart along: every parameter over all of
// them, except an expert of an expert-parallel mixture (held apart along ep),
// over dp x sp only, by buckets of its own, and then divided by the ep size:
// the all-to-all's backward already summed, on the expert's rank, the
// gradients of every ep peer's tokens, so the mean over all data ranks is
// that sum over dp x sp divided by dp x sp x ep.
#include <torch/torch.h>

#include <map>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/core/grad_buckets.h"
#include "kolos/core/gradient_strategy.h"
#include "kolos/core/mesh.h"
#include "kolos/core/optimizer.h"
#include "kolos/core/plugin_registry.h"

namespace kolos {
namespace {

class DataParallel : public GradientStrategy {
 public:
  std::string name() const override { return "dp"; }

  void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) override {
    model_ = &model;
    const AxisSet data = batch_axes() | AxisSet{Axis::kSP};
    std::map<uint8_t, std::vector<GradBuckets::Param>> by_axes;
    for (auto& p : model.placed_parameters()) {
      if (!p.tensor.requires_grad()) continue;
      params_.push_back(p);
      const AxisSet over = data.without(p.placement.sharded());
      by_axes[over.bits()].push_back(GradBuckets::Param{p.name, p.tensor, {}});
    }
    GradBuckets::Options options;
    options.reduction = GradBuckets::Reduction::kAllReduce;
    options.bucket_bytes = config.parallel.bucket_kb > 0 ? config.parallel.bucket_kb * 1024
                                                         : config.parallel.bucket_mb * 1024 * 1024;
    options.reduce_in_fp32 = reduce_in_fp32(config);
    options.allreduce = comm::parse_all_reduce_mode(config.parallel.allreduce);
    // The whole data group's buckets first (every rank has them), then the
    // narrower groups', in the order of their axis bits: the same on every
    // rank of each group.
    auto whole = by_axes.find(data.bits());
    if (whole != by_axes.end()) {
      sets_.push_back(make_set(mesh, data, data, std::move(whole->second), options));
      by_axes.erase(whole);
    }
    for (auto& [bits, params] : by_axes) {
      sets_.push_back(make_set(mesh, data, AxisSet(bits), std::move(params), options));
    }
    group_ = mesh.group(data);

    // The .grad tensors keep their identity when the buckets are rebuilt.
    optimizer_ = std::make_unique<AdamW>(adamw_settings(config.optim));
    for (auto& p : params_) optimizer_->add(p.name, p.tensor, p.tensor.grad(), p.placement);
  }

  void zero_grad() override {
    for (auto& set : sets_) set.buckets->zero_grad();
  }

  void prepare_backward(bool sync) override {
    sync_ = sync;
    for (auto& set : sets_) set.buckets->prepare_backward(sync);
  }

  void finish_backward() override {
    KOLOS_CHECK(sync_ || group_->size() == 1,
                "dp: finish_backward() after a backward that was not the step's last");
    for (auto& set : sets_) {
      set.buckets->finish_backward();
      if (set.factor != 1.0) {
        for (auto& grad : set.grads) grad.mul_(set.factor);
      }
    }
  }

  std::vector<GradPiece> grad_pieces() override {
    std::vector<GradPiece> pieces;
    for (auto& p : params_) pieces.push_back(GradPiece{p.tensor.grad(), p.placement});
    return pieces;
  }

  void step(double lr) override { optimizer_->step(lr); }

  std::vector<StatePiece> optimizer_state() override { return optimizer_->state_pieces(); }
  int64_t optimizer_steps() const override { return optimizer_->step_count(); }
  AdamW* adamw() override { return optimizer_.get(); }
  void set_optimizer_steps(int64_t steps) override { optimizer_->set_step_count(steps); }

  MemoryStats memory() const override {
    MemoryStats m;
    for (const auto& p : params_) m.parameter_bytes += p.tensor.numel() * p.tensor.element_size();
    for (const auto& set : sets_) m.gradient_bytes += set.buckets->gradient_bytes();
    m.optimizer_bytes = optimizer_->state_bytes() + optimizer_->master_bytes();
    return m;
  }

  // The whole data group's figures, with the narrower groups' traffic added.
  ReductionStats reduction_stats() const override {
    if (sets_.empty()) return {};
    ReductionStats stats = sets_.front().buckets->stats();
    for (size_t i = 1; i < sets_.size(); ++i) {
      stats.add(sets_[i].buckets->stats());
    }
    return stats;
  }

 private:
  // Parameters whose gradients are averaged over one group.
  struct BucketSet {
    std::unique_ptr<GradBuckets> buckets;
    double factor = 1.0;            // after the group's mean: its size / the data group's
    std::vector<at::Tensor> grads;  // the .grad tensors to scale by it
  };
  static BucketSet make_set(const DeviceMesh& mesh, AxisSet data, AxisSet over,
                            std::vector<GradBuckets::Param> params,
                            const GradBuckets::Options& options) {
    BucketSet set;
    std::vector<at::Tensor> tensors;
    for (const auto& p : params) tensors.push_back(p.tensor);
    set.buckets = std::make_unique<GradBuckets>(std::move(params), mesh.group(over), options);
    set.factor = static_cast<double>(mesh.layout().size(over)) /
                 static_cast<double>(mesh.layout().size(data));
    for (const auto& t : tensors) set.grads.push_back(t.grad());
    return set;
  }

  comm::ProcessGroupPtr group_;
  std::vector<PlacedParameter> params_;
  std::vector<BucketSet> sets_;
  std::unique_ptr<AdamW> optimizer_;
  bool sync_ = true;
};

}  // namespace
}  // namespace kolos

KOLOS_DEFINE_PLUGIN("dp", "gradients", kolos::GradientStrategy, kolos::DataParallel,
                    "data parallelism: bucketed all-reduce overlapped with backward")
