// Activation recomputation (recompute.h).
//
// A torch::autograd::Function whose forward runs fn under no-grad (Function
// already does) and saves only its inputs; its backward re-runs fn with
// grad enabled on detached inputs and differentiates the recomputed outputs
// with autograd::grad (a reentrant backward, as PyTorch's reentrant
// checkpoint does). The parameters fn reads are inputs of the Function, so
// their gradients leave backward through the Function's edges into their
// gradient accumulators: the gradients plugins' hooks fire as without
// recomputation, autograd::grad restricted to inputs and backward
// restricted to parameters (the zero-bubble pipeline's two halves) both
// work, and a retained graph recomputes again when run again.
#include "kolos/core/recompute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <atomic>
#include <mutex>
#include <utility>

#include "kolos/core/error.h"

namespace kolos {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved inputs. A capsule in the context's
// saved_data, since saved_data holds IValues and a std::function is not one.
struct RecomputeState : torch::CustomClassHolder {
  RecomputeFn fn;
  std::vector<bool> input_requires_grad;
  std::vector<at::Tensor> parameters;  // trainable ones only
  at::Tensor rng_state;                // the CPU generator's, before fn ran
};

std::atomic<int64_t> g_recomputations{0};

at::Tensor generator_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(const at::Tensor& state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  static variable_list forward(AutogradContext* ctx, const c10::intrusive_ptr<RecomputeState>& state,
                               at::TensorList inputs, at::TensorList /*parameters: edges only*/) {
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["state"] = at::IValue::make_capsule(state);
    state->rng_state = generator_state();
    return state->fn(inputs.vec());  // Function::apply runs this under no-grad
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<RecomputeState>(
        ctx->saved_data.at("state").toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    variable_list wrt;  // detached inputs that need a gradient, then the parameters
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor input = saved[i].detach();
      if (state->input_requires_grad[i]) {
        input.requires_grad_(true);
        wrt.push_back(input);
      }
      inputs.push_back(std::move(input));
    }
    for (const auto& p : state->parameters) wrt.push_back(p);

    // The same random draws as the forward, and the generator left as
    // backward found it.
    const at::Tensor now = generator_state();
    set_generator_state(state->rng_state);
    std::vector<at::Tensor> outputs;
    try {
      torch::AutoGradMode grad_mode(true);
      outputs = state->fn(inputs);
      g_recomputations.fetch_add(1, std::memory_order_relaxed);
    } catch (...) {
      set_generator_state(now);
      throw;
    }
    set_generator_state(now);
    KOLOS_CHECK(outputs.size() == grad_outputs.size(), "recomputation returned ", outputs.size(),
                " tensors where the forward returned ", grad_outputs.size());

    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    variable_list grads;
    if (!roots.empty() && !wrt.empty()) {
      grads = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    }
    // One gradient per forward argument: none for the state, then the
    // inputs', then the parameters'.
    variable_list result(1 + saved.size() + state->parameters.size());
    size_t next = 0;
    for (size_t i = 0; i < saved.size(); ++i) {
      if (state->input_requires_grad[i] && !grads.empty()) result[1 + i] = grads[next];
      if (state->input_requires_grad[i]) ++next;
    }
    for (size_t j = 0; j < state->parameters.size() && !grads.empty(); ++j) {
      result[1 + saved.size() + j] = grads[next + j];
    }
    return result;
  }
};

thread_local bool attention_recompute = false;

}  // namespace

std::vector<at::Tensor> recomputed(RecomputeFn fn, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& parameters) {
  auto state = c10::make_intrusive<RecomputeState>();
  bool needs_grad = false;
  for (const auto& t : inputs) {
    state->input_requires_grad.push_back(t.requires_grad());
    needs_grad = needs_grad || t.requires_grad();
  }
  for (const auto& p : parameters) {
    if (p.requires_grad()) state->parameters.push_back(p);
  }
  needs_grad = needs_grad || !state->parameters.empty();
  if (!torch::GradMode::is_enabled() || !needs_grad) return fn(inputs);
  state->fn = std::move(fn);
  return RecomputeFunction::apply(state, at::TensorList(inputs), at::TensorList(state->parameters));
}

int64_t recomputations_run() { return g_recomputations.load(std::memory_order_relaxed); }

AttentionRecomputeScope::AttentionRecomputeScope(bool active) : previous_(attention_recompute) {
  attention_recompute = active;
}

AttentionRecomputeScope::~AttentionRecomputeScope() { attention_recompute = previous_; }

bool AttentionRecomputeScope::active() { return attention_recompute; }

at::Tensor recompute_if_selected(at::Tensor (*fn)(const std::vector<at::Tensor>& inputs),
                                 const std::vector<at::Tensor>& inputs) {
  if (!attention_recompute) return fn(inputs);
  return recomputed([fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in)}; },
                    inputs, {})
      .at(0);
}

}  // namespace kolos
