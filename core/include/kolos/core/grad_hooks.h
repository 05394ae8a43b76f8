// "This parameter's gradient is complete": the hook gradients plugins use to
// start reductions during backward.
//
// The callback runs after autograd's AccumulateGrad has added the
// parameter's gradient of the current backward into `param.grad()` (a
// post-hook on its gradient accumulator, as PyTorch DDP's reducer does), on
// the thread running backward. A leaf used several times in the graph (tied
// weights) gets its contributions summed first, so the callback runs once per
// backward. Autograd holds accumulators weakly: keep the returned pointer
// alive as long as the hook should fire.
#pragma once

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "kolos/core/error.h"

namespace kolos {

namespace detail {
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};
}  // namespace detail

// The owning pointer autograd hands out for a gradient accumulator:
// std::shared_ptr<Node> in LibTorch 1.x, c10::intrusive_ptr<Node> in 2.x
// (graph nodes became intrusively counted). Spelled through decltype so that
// both compile without a version check.
using GradAccumulatorPtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

inline GradAccumulatorPtr on_grad_accumulated(const at::Tensor& param, const std::string& name,
                                              std::function<void()> on_ready) {
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  KOLOS_CHECK(accumulator != nullptr, "parameter ", name,
              " has no gradient accumulator (is it a leaf that requires grad?)");
  accumulator->add_post_hook(std::make_unique<detail::GradReadyHook>(std::move(on_ready)));
  return accumulator;
}

}  // namespace kolos
