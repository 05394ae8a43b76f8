#include "kolos/core/schedule.h"

#include <torch/torch.h>

#include "kolos/core/aux_loss.h"
#include "kolos/core/comm/watchdog.h"

namespace kolos {

void PipelineSchedule::setup(Model&, const DeviceMesh&, const RunConfig&) {}

namespace {

class SingleStageSchedule : public PipelineSchedule {
 public:
  std::string name() const override { return "single-stage"; }
  StepLoss run(StepContext& context) override {
    const auto& micro = *context.micro_batches;
    const double scale = context.loss_scale / static_cast<double>(micro.size());
    set_aux_loss_multiplier(scale);
    StepLoss result;
    for (size_t m = 0; m < micro.size(); ++m) {
      comm::set_progress_micro_batch(static_cast<int64_t>(m));
      context.gradients->prepare_backward(/*sync=*/m + 1 == micro.size());
      at::Tensor output = context.model->forward(micro[m].inputs);
      at::Tensor loss = context.model->loss(output, micro[m].targets);
      (loss * scale).backward();
      result.sum += loss.item<double>();
      result.count += 1;
    }
    return result;
  }
};

}  // namespace

std::shared_ptr<PipelineSchedule> make_single_stage_schedule() {
  return std::make_shared<SingleStageSchedule>();
}

}  // namespace kolos
