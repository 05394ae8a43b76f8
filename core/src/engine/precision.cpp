#include "kolos/core/precision.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <set>
#include <string>

#include "kolos/core/config_located.h"
#include "kolos/core/settings.h"
#include "kolos/core/error.h"
#include "kolos/core/model.h"
#include "kolos/core/runtime.h"

namespace kolos {

at::ScalarType precision_dtype(const RunConfig& config) {
  const std::string& p = config.train.precision;
  if (p == "bf16") return at::kBFloat16;
  if (p == "fp16") return at::kHalf;
  return at::kFloat;
}

void check_precision_runs(const RunConfig& config) {
  const at::ScalarType dtype = precision_dtype(config);
  if (dtype == at::kFloat) return;
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::ones({4, 4}, torch::TensorOptions().dtype(dtype));
  // The ops every model's forward and backward needs, smallest first.
  const char* op = "matmul";
  try {
    (void)torch::matmul(x, x);
    op = "layer_norm";
    (void)torch::layer_norm(x, {4});
    op = "gelu";
    (void)torch::gelu(x);
    op = "softmax";
    (void)torch::softmax(x, -1);
  } catch (const std::exception& e) {
    std::string what = error_text(e);
    what = what.substr(0, what.find('\n'));
    throw ConfigError(located(
        config, "train.precision",
        quote_toml(config.train.precision) + ": LibTorch " TORCH_VERSION " cannot run " + op +
            " in " + config.train.precision + " on the CPU (" + what + "); use precision = " +
            (dtype == at::kHalf ? "\"bf16\" or \"fp32\"" : "\"fp32\"") +
            "."));
  }
}

void cast_parameters(const std::vector<PlacedParameter>& parameters, at::ScalarType dtype) {
  if (dtype == at::kFloat) return;
  torch::NoGradGuard no_grad;
  std::set<const void*> done;  // a tied weight is listed under each name
  for (const auto& p : parameters) {
    if (!done.insert(p.tensor.unsafeGetTensorImpl()).second) continue;
    if (!p.tensor.is_floating_point() || p.tensor.scalar_type() == dtype) continue;
    at::Tensor t = p.tensor;
    t.set_data(t.detach().to(dtype));
  }
}

void cast_parameters(Model& model, at::ScalarType dtype) {
  cast_parameters(model.all_parameters(), dtype);
}

void move_parameters(const std::vector<PlacedParameter>& parameters, const at::Device& device) {
  torch::NoGradGuard no_grad;
  std::set<const void*> done;
  for (const auto& p : parameters) {
    if (!done.insert(p.tensor.unsafeGetTensorImpl()).second) continue;
    if (p.tensor.device() == device) continue;
    at::Tensor t = p.tensor;
    t.set_data(t.detach().to(device));
  }
}

void move_parameters(Model& model, const at::Device& device) {
  move_parameters(model.all_parameters(), device);
}

void LossScaler::update(bool overflow) {
  if (overflow) {
    scale_ *= 0.5;
    good_steps_ = 0;
    return;
  }
  if (++good_steps_ >= growth_interval_) {
    scale_ *= 2.0;
    good_steps_ = 0;
  }
}

}  // namespace kolos
