#include <torch/torch.h>

#include "hf_detail.h"
#include "kolos/core/error.h"

namespace kolos::modules {
namespace hf_detail {

Tensors::Tensors(const NamedTensors& tensors, std::string what) : what_(std::move(what)) {
  for (const auto& [name, tensor] : tensors) {
    KOLOS_CHECK_KIND(kCheckpoint, left_.emplace(name, tensor).second, what_,
                     " holds tensor `", name, "` twice");
  }
}

at::Tensor Tensors::take(const std::string& name, const std::vector<int64_t>& shape) {
  auto it = left_.find(name);
  KOLOS_CHECK_KIND(kCheckpoint, it != left_.end(), what_, " has no tensor `", name,
                   "`, which the configuration's model has");
  KOLOS_CHECK_KIND(kCheckpoint, it->second.sizes().vec() == shape, what_, ": tensor `", name,
                   "` has shape ", it->second.sizes(), ", the configuration's model needs ",
                   c10::IntArrayRef(shape));
  at::Tensor t = it->second;
  left_.erase(it);
  return t;
}

void Tensors::expect_empty(const std::string& counterpart, const std::string& hint) const {
  KOLOS_CHECK_KIND(kCheckpoint, left_.empty(), what_, ": tensor `",
                   left_.empty() ? "" : left_.begin()->first, "` has no ", counterpart,
                   " counterpart (", left_.size(), " left over); ", hint);
}

void Config::refuse(const std::string& key, const std::string& why) const {
  const std::string value = json_.contains(key) ? json_[key].dump() : std::string("(absent)");
  throw Error(where_ + ": `" + prefix_ + key + "` = " + value + ": " + why, ErrorKind::kCheckpoint);
}

Config Config::object(const std::string& key) const {
  if (!has(key) || !json_[key].is_object()) refuse(key, "not an object");
  return Config(json_[key], where_, prefix_ + key + ".");
}

int64_t Config::integer(const std::string& key) const {
  if (!has(key)) refuse(key, "needed, and missing");
  if (!json_[key].is_number_integer()) refuse(key, "not an integer");
  return json_[key].get<int64_t>();
}

int64_t Config::integer(const std::string& key, int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}

double Config::number(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  if (!json_[key].is_number()) refuse(key, "not a number");
  return json_[key].get<double>();
}

std::string Config::string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  if (!json_[key].is_string()) refuse(key, "not a string");
  return json_[key].get<std::string>();
}

bool Config::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  if (!json_[key].is_boolean()) refuse(key, "not true or false");
  return json_[key].get<bool>();
}

void check_sizes(const Config& config, const ModelConfig& c, const SizeKeys& keys) {
  if (c.hidden <= 0 || c.heads <= 0 || c.hidden % c.heads != 0) {
    config.refuse(keys.heads, keys.hidden + " = " + std::to_string(c.hidden) +
                                  " must be a positive multiple of " + keys.heads);
  }
  if (c.layers <= 0) config.refuse(keys.layers, "must be positive");
}

void open_config(std::ostringstream& json, const std::string& architecture,
                 const std::string& model_type) {
  json.precision(17);
  json << "{\n"
       << "  \"architectures\": [\"" << architecture << "\"],\n"
       << "  \"model_type\": \"" << model_type << "\",\n";
}

std::string close_config(std::ostringstream& json) {
  json << "  \"torch_dtype\": \"float32\"\n"
       << "}\n";
  return json.str();
}

}  // namespace hf_detail

HfModel to_hf(const ModelConfig& model, const NamedTensors& weights) {
  if (model.name == "gpt") return gpt_to_hf_gpt2(model, weights);
  if (llama_family(model)) return llama_to_hf_llama(model, weights);
  if (model.name == "vit") return vit_to_hf_vit(model, weights);
  throw ConfigError("model `" + model.name +
                    "` has no Hugging Face counterpart; --format hf converts `gpt` (GPT-2), "
                    "`llama` (LLaMA), `mixtral` (Mixtral) and `vit` (ViT)");
}

ImportedModel from_hf(const std::string& config_json, const NamedTensors& tensors,
                      const std::string& where) {
  const std::string file = where + "/config.json";
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(config_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(file + " is not JSON: " + e.what(), ErrorKind::kCheckpoint);
  }
  KOLOS_CHECK_KIND(kCheckpoint, json.is_object(), file, " is not a JSON object");
  const hf_detail::Config config(json, file);
  const std::string type = config.string("model_type", "");
  if (type == "gpt2") return hf_detail::gpt2_from_hf(config, tensors);
  if (type == "llama" || type == "mixtral") return hf_detail::llama_from_hf(config, tensors);
  if (type == "vit") return hf_detail::vit_from_hf(config, tensors);
  config.refuse("model_type",
                "kolos imports \"gpt2\" (GPT2LMHeadModel, as model `gpt`), \"llama\" "
                "(LlamaForCausalLM, as model `llama`), \"mixtral\" (MixtralForCausalLM, as "
                "model `mixtral`) and \"vit\" (ViTForImageClassification, as model `vit`)");
}

}  // namespace kolos::modules
