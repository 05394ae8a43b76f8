// Choosing the next token from a row of logits: greedy, temperature, top-k,
// top-p, min-p, repetition and presence penalties, with a random stream per
// request (the same seed gives the same tokens, whatever else runs beside
// it). Runs on rank 0 over a float row; torch-free.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace kolos::inference {

struct SamplingParams {
  int64_t max_tokens = 64;
  double temperature = 0.0;  // 0: greedy (argmax, the lowest id on a tie)
  int64_t top_k = 0;         // 0: every token
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;  // Hugging Face's: logit / p if > 0, else logit * p
  double presence_penalty = 0.0;    // OpenAI's: minus this once per distinct generated token
  uint64_t seed = 0;
  std::vector<int64_t> stop_token_ids;  // end the request after emitting one of these
  // -1: none; N in [0, 20]: each generated token's log-probability and the
  // N most likely tokens' (TokenLogprob).
  int64_t logprobs = -1;
};

// The log-probability of a generated token under the model's distribution:
// log_softmax of the raw logits row (before penalties, temperature and the
// top-k / top-p / min-p filters), and the `top` most likely tokens' (by
// descending log-probability, the lower id first on a tie).
struct TokenLogprob {
  int64_t token = 0;
  double logprob = 0;
  std::vector<std::pair<int64_t, double>> top;
};
TokenLogprob log_probabilities(const std::vector<float>& logits, int64_t token, int64_t top);

// Throws kolos::Error (kind config) naming the field when a value is out of
// range (NaN or negative temperature, top_p outside (0, 1], ...).
void check_sampling(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // The next token for `logits` (one row over the vocabulary; modified in
  // place by the penalties and filters). `prompt` and `generated` are the
  // request's tokens so far (penalties). Draws one number from this
  // request's stream unless greedy.
  int64_t sample(std::vector<float>& logits, const std::vector<int64_t>& prompt,
                 const std::vector<int64_t>& generated);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace kolos::inference
