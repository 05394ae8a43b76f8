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
#include <torch/torch.h>

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
    group_ = mesh.group(AxisSet{Axis::kDP, Axis::kSP});
    std::vector<GradBuckets::Param> bucketed;
    for (auto& p : model.placed_parameters()) {
      if (!p.tensor.requires_grad()) continue;
      params_.push_back(p);
      bucketed.push_back(GradBuckets::Param{p.name, p.tensor, {}});
    }
    GradBuckets::Options options;
    options.reduction = GradBuckets::Reduction::kAllReduce;
    options.bucket_bytes = config.parallel.bucket_kb > 0 ? config.parallel.bucket_kb * 1024
                                                         : config.parallel.bucket_mb * 1024 * 1024;
    options.reduce_in_fp32 = reduce_in_fp32(config);
    options.allreduce = comm::parse_all_reduce_mode(config.parallel.allreduce);
    buckets_ = std::make_unique<GradBuckets>(std::move(bucketed), group_, options);

    // The .grad tensors keep their identity when the buckets are rebuilt.
    optimizer_ = std::make_unique<AdamW>(adamw_settings(config.optim));
    for (auto& p : params_) optimizer_->add(p.name, p.tensor, p.tensor.grad(), p.placement);
  }

  void zero_grad() override { buckets_->zero_grad(); }

  void prepare_backward(bool sync) override {
    sync_ = sync;
    buckets_->prepare_backward(sync);
  }

  void finish_backward() override {
    KOLOS_CHECK(sync_ || group_->size() == 1,
                "dp: finish_backward() after a backward that was not the step's last");
    buckets_->finish_backward();
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
    m.gradient_bytes = buckets_->gradient_bytes();
    m.optimizer_bytes = optimizer_->state_bytes() + optimizer_->master_bytes();
    return m;
  }

  ReductionStats reduction_stats() const override { return buckets_->stats(); }

 private:
  comm::ProcessGroupPtr group_;
  std::vector<PlacedParameter> params_;
  std::unique_ptr<GradBuckets> buckets_;
  std::unique_ptr<AdamW> optimizer_;
  bool sync_ = true;
};

}  // namespace
}  // namespace kolos

KOLOS_DEFINE_PLUGIN("dp", "gradients", kolos::GradientStrategy, kolos::DataParallel,
                    "data parallelism: bucketed all-reduce overlapped with backward")
