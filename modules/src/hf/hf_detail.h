// What the Hugging Face conversions share: taking named tensors with their
// shapes checked, reading config.json's keys with the key named in every
// error, and writing config.json.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kolos/modules/hf.h"

namespace kolos::modules::hf_detail {

// A tensor's kolos name and Hugging Face name, with the shape both give it:
// the conversions that rename without reshaping list these.
struct TensorName {
  std::string kolos, hf;
  std::vector<int64_t> shape;
};

// Tensors by name, each taken once; what is left at the end is an error.
class Tensors {
 public:
  // `what` names the source in messages ("the checkpoint", "gpt2/model.safetensors").
  Tensors(const NamedTensors& tensors, std::string what);
  // The tensor `name`, with shape `shape`; removed from what is left.
  at::Tensor take(const std::string& name, const std::vector<int64_t>& shape);
  bool has(const std::string& name) const { return left_.count(name) > 0; }
  // Drops `name` if present (buffers that are not weights).
  void drop(const std::string& name) { left_.erase(name); }
  // Throws naming one tensor left over (`hint`: what the model was taken to be).
  void expect_empty(const std::string& counterpart, const std::string& hint) const;

 private:
  std::map<std::string, at::Tensor> left_;
  std::string what_;
};

// config.json's keys, read with the key and file named in every error.
class Config {
 public:
  Config(const nlohmann::json& json, std::string where, std::string prefix = "")
      : json_(json), where_(std::move(where)), prefix_(std::move(prefix)) {}
  // The object at `key` (its keys named `key.<name>` in errors).
  Config object(const std::string& key) const;
  bool has(const std::string& key) const { return json_.contains(key) && !json_[key].is_null(); }
  int64_t integer(const std::string& key) const;
  int64_t integer(const std::string& key, int64_t fallback) const;
  double number(const std::string& key, double fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  // The number of entries of this object (or array).
  size_t size() const { return json_.size(); }
  // Throws: config.json's `key` = <value>: `why`.
  [[noreturn]] void refuse(const std::string& key, const std::string& why) const;
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& json_;
  std::string where_;
  std::string prefix_;
};

// config.json's keys for a transformer's width, depth and attention heads.
struct SizeKeys {
  std::string hidden, layers, heads;
};
// Refuses sizes no kolos transformer has: a hidden size that is not a
// positive multiple of the heads, or no layers (naming the key at fault).
void check_sizes(const Config& config, const ModelConfig& c, const SizeKeys& keys);

// config.json, written in transformers' layout: open_config starts the
// object (doubles at full precision, "architectures" and "model_type"), the
// caller writes its keys, each line ending ",\n", and close_config ends it
// with the dtype of every export (float32) and returns the text.
void open_config(std::ostringstream& json, const std::string& architecture,
                 const std::string& model_type);
std::string close_config(std::ostringstream& json);

ImportedModel gpt2_from_hf(const Config& config, const NamedTensors& tensors);
ImportedModel llama_from_hf(const Config& config, const NamedTensors& tensors);
ImportedModel vit_from_hf(const Config& config, const NamedTensors& tensors);

}  // namespace kolos::modules::hf_detail
