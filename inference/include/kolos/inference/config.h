// [inference]: the settings of `kolos generate` (libkolos_inference), one
// table that reads, checks and documents them (docs/inference.md).
// Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/core/run_config.h"
#include "kolos/inference/sampler.h"

namespace kolos::inference {

struct InferenceConfig {
  // Bytes of K/V cache per rank (all layers, keys and values); the pool's
  // block count follows from it, the model and the precision.
  int64_t kv_cache_memory = int64_t{64} << 20;
  int64_t block_size = 16;         // tokens per KV block
  int64_t max_seqs = 32;           // sequences in one step at most
  int64_t max_step_tokens = 256;   // tokens computed in one step at most (chunked prefill)
  std::string precision = "fp32";  // "fp32" | "bf16": the dtype weights and cache are held in
  // fp32 on the CPU: pack the linear layers' weights once, into kolos's
  // panels or oneDNN's blocked layout (kolos/core/packed_linear.h), instead
  // of LibTorch's products re-packing them on every call.
  bool pack_weights = true;
  // Pipeline stages: the ranks form pipeline_stages stages of
  // ranks / pipeline_stages tensor-parallel ranks each.
  int64_t pipeline_stages = 1;
  // Sampling defaults of every request.
  int64_t max_tokens = 64;          // new tokens per request at most
  double temperature = 0.0;         // 0: greedy
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // (0, 1]
  double min_p = 0.0;               // [0, 1]
  double repetition_penalty = 1.0;  // > 0; 1: off
  double presence_penalty = 0.0;    // subtracted once per distinct generated token
  int64_t seed = 0;
  std::vector<int64_t> stop_token_ids;
  // Text (rank 0 only): a tokenizer.json or tokenizer.model (empty: the
  // model directory's own, if it has one); stop strings end a request at
  // their first occurrence in its text (which then leaves them out);
  // ignore_eos: do not stop at the tokenizer's end-of-text id.
  std::string tokenizer;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // kolos serve's /v1/chat/completions: a Jinja2 chat template file (empty:
  // the tokenizer's own, from tokenizer_config.json or chat_template.jinja).
  std::string chat_template;

  SamplingParams sampling() const;
};

// Reads and checks config.section("inference"): an unknown key, a wrong
// type or a value out of range is a ConfigError at its file:line naming
// the valid keys or range. Other sections are not looked at.
InferenceConfig read_inference_config(const RunConfig& config);

// The section as TOML ("[inference]\nkey = value\n..."), every key.
std::string inference_toml(const InferenceConfig& config);

// The keys of [inference], in table order.
std::vector<std::string> inference_keys();

}  // namespace kolos::inference
