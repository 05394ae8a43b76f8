#include "kolos/core/model.h"

#include <torch/torch.h>

#include <map>
#include <mutex>
#include <unordered_set>

#include "kolos/core/error.h"

namespace kolos {

void Model::add_block(const std::string& name, LayerPtr block) {
  // "h.3" is registered as child "3" of a container "h", as torch's
  // ModuleList would, so parameter names read "h.3.attn.q_proj.weight".
  torch::nn::Module* parent = this;
  std::string rest = name;
  for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
    const std::string part = rest.substr(0, dot);
    auto children = parent->named_children();
    if (auto* found = children.find(part)) {
      parent = found->get();
    } else {
      parent = parent->register_module(part, std::make_shared<torch::nn::Module>()).get();
    }
  }
  parent->register_module(rest, block);
  blocks_.emplace_back(name, std::move(block));
}

at::Tensor Model::forward(const at::Tensor& input, size_t first, size_t last) {
  last = std::min(last, blocks_.size());
  at::Tensor x = input;
  for (size_t i = first; i < last; ++i) {
    if (hooks_.before_forward) hooks_.before_forward(i, x);
    x = blocks_[i].second->forward(x);
    if (hooks_.after_forward) hooks_.after_forward(i, x);
  }
  return x;
}

at::Tensor Model::loss(const at::Tensor& output, const at::Tensor& targets) const {
  KOLOS_CHECK(static_cast<bool>(loss_), "the model has no loss function (Model::set_loss)");
  return loss_(output, targets);
}

std::vector<PlacedParameter> Model::placed_parameters() const {
  std::vector<PlacedParameter> out;
  std::unordered_set<const void*> seen;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const auto& [block_name, block] = blocks_[b];
    for (const auto& item : block->named_modules(block_name)) {
      const std::string& prefix = item.key();
      const auto* layer = dynamic_cast<const Layer*>(item.value().get());
      for (const auto& param : item.value()->named_parameters(/*recurse=*/false)) {
        if (!seen.insert(param.value().unsafeGetTensorImpl()).second) continue;
        Placement placement;
        if (layer != nullptr && layer->placements().count(param.key())) {
          placement = layer->placements().at(param.key());
        } else {
          placement = Placement::replicated(param.value().sizes().vec());
        }
        out.push_back(PlacedParameter{prefix + "." + param.key(), param.value(),
                                      std::move(placement), static_cast<int>(b)});
      }
    }
  }
  return out;
}

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, ModelBuilder>& registry() {
  static std::map<std::string, ModelBuilder> r;
  return r;
}
}  // namespace

void register_model(const std::string& name, ModelBuilder builder) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = std::move(builder);
}

std::vector<std::string> registered_models() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> names;
  for (const auto& [name, builder] : registry()) names.push_back(name);
  return names;
}

std::shared_ptr<Model> build_model(const ModelConfig& config, LayerFactory& factory) {
  ModelBuilder builder;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(config.name);
    if (it != registry().end()) builder = it->second;
  }
  if (!builder) {
    std::string known;
    for (const auto& name : registered_models()) known += (known.empty() ? "" : ", ") + name;
    std::string hint = closest_match(config.name, registered_models());
    throw ConfigError("model.name: no model named `" + config.name + "`" +
                      (hint.empty() ? "" : " (did you mean `" + hint + "`?)") +
                      "; known models: " + (known.empty() ? "none" : known));
  }
  return builder(config, factory);
}

}  // namespace kolos
