#include "kolos/inference/config.h"

#include <cmath>
#include <sstream>

#include "kolos/core/settings.h"

namespace kolos::inference {
namespace {

std::string positive(double x) { return std::isfinite(x) && x > 0 ? "" : "a finite number > 0"; }
std::string at_least_zero(double x) {
  return std::isfinite(x) && x >= 0 ? "" : "a finite number >= 0";
}

const SettingsTable<InferenceConfig>& table() {
  static const auto t =
      SettingsTable<InferenceConfig>("inference")
          .bytes("kv_cache_memory", &InferenceConfig::kv_cache_memory)
          .integer("block_size", &InferenceConfig::block_size, 1, 4096)
          .integer("max_seqs", &InferenceConfig::max_seqs, 1, 1 << 20)
          .integer("max_step_tokens", &InferenceConfig::max_step_tokens, 1, 1 << 24)
          .choice("precision", &InferenceConfig::precision, {"fp32", "bf16"}, "inference precision")
          .boolean("pack_weights", &InferenceConfig::pack_weights)
          .integer("pipeline_stages", &InferenceConfig::pipeline_stages, 1, 1 << 16)
          .integer("max_tokens", &InferenceConfig::max_tokens, 1)
          .number("temperature", &InferenceConfig::temperature, at_least_zero)
          .integer("top_k", &InferenceConfig::top_k, 0)
          .number("top_p", &InferenceConfig::top_p,
                  [](double x) { return x > 0 && x <= 1 ? "" : "in (0, 1]"; })
          .number("min_p", &InferenceConfig::min_p,
                  [](double x) { return x >= 0 && x <= 1 ? "" : "in [0, 1]"; })
          .number("repetition_penalty", &InferenceConfig::repetition_penalty, positive)
          .number("presence_penalty", &InferenceConfig::presence_penalty,
                  [](double x) { return std::isfinite(x) ? "" : "a finite number"; })
          .integer("seed", &InferenceConfig::seed, 0)
          .integers("stop_token_ids", &InferenceConfig::stop_token_ids, 0, "token id")
          .string("tokenizer", &InferenceConfig::tokenizer)
          .strings("stop", &InferenceConfig::stop)
          .boolean("ignore_eos", &InferenceConfig::ignore_eos)
          .string("chat_template", &InferenceConfig::chat_template);
  return t;
}

}  // namespace

SamplingParams InferenceConfig::sampling() const {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repetition_penalty = repetition_penalty;
  p.presence_penalty = presence_penalty;
  p.seed = static_cast<uint64_t>(seed);
  p.stop_token_ids = stop_token_ids;
  return p;
}

InferenceConfig read_inference_config(const RunConfig& config) {
  InferenceConfig out;
  const ConfigSection section = config.section("inference");
  table().read(section, out, {}, "kolos generate");
  if (out.kv_cache_memory <= 0) section.fail("kv_cache_memory", "must be more than 0 bytes.");
  for (const auto& s : out.stop) {
    if (s.empty()) section.fail("stop", "an empty stop string would stop every request at once.");
  }
  return out;
}

std::string inference_toml(const InferenceConfig& config) {
  std::ostringstream out;
  out << "[inference]\n";
  table().write(config, out);
  return out.str();
}

std::vector<std::string> inference_keys() { return table().keys(); }

}  // namespace kolos::inference
