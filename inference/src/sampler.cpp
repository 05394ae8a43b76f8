#include "kolos/inference/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <string>

#include "kolos/core/error.h"

namespace kolos::inference {
namespace {

[[noreturn]] void refuse(const std::string& field, const std::string& message) {
  throw ConfigError(field + ": " + message);
}

std::string show(double x) {
  char text[64];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

// std::max_element's answer (the first element that no later one exceeds;
// NaNs are passed over, unless the row starts with one), without its chain
// of dependent loads and compares: eight lanes each keep their own maximum,
// then the first element equal to the largest of them is the answer. About
// a tenth of std::max_element's time over a row of 32000 logits, which the
// greedy decoding of every sequence in every step scans.
size_t first_max(const std::vector<float>& v) {
  const size_t n = v.size();
  if (n == 0 || std::isnan(v[0])) return 0;
  constexpr size_t kLanes = 8;
  float lane[kLanes];
  for (float& l : lane) l = v[0];
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] = lane[j] < v[i + j] ? v[i + j] : lane[j];
  }
  for (; i < n; ++i) lane[0] = lane[0] < v[i] ? v[i] : lane[0];
  float top = lane[0];
  for (const float l : lane) top = top < l ? l : top;
  for (i = 0; i < n; ++i) {
    if (v[i] == top) return i;
  }
  return 0;  // not reached: top is one of the elements
}

}  // namespace

void check_sampling(const SamplingParams& p) {
  if (p.max_tokens < 1) refuse("max_tokens", std::to_string(p.max_tokens) + " must be >= 1");
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    refuse("temperature", show(p.temperature) + " must be a finite number >= 0 (0: greedy)");
  }
  if (p.top_k < 0) refuse("top_k", std::to_string(p.top_k) + " must be >= 0 (0: off)");
  if (!(p.top_p > 0 && p.top_p <= 1)) refuse("top_p", show(p.top_p) + " must be in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) refuse("min_p", show(p.min_p) + " must be in [0, 1]");
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0) {
    refuse("repetition_penalty", show(p.repetition_penalty) + " must be a finite number > 0");
  }
  if (!std::isfinite(p.presence_penalty)) {
    refuse("presence_penalty", show(p.presence_penalty) + " must be a finite number");
  }
  if (p.logprobs < -1 || p.logprobs > 20) {
    refuse("logprobs", std::to_string(p.logprobs) + " must be in [0, 20] (-1: off)");
  }
  for (const int64_t id : p.stop_token_ids) {
    if (id < 0) refuse("stop_token_ids", "token " + std::to_string(id) + " must be >= 0");
  }
}

TokenLogprob log_probabilities(const std::vector<float>& logits, int64_t token, int64_t top) {
  KOLOS_CHECK(!logits.empty() && token >= 0 && token < static_cast<int64_t>(logits.size()),
              "log_probabilities: token ", token, " of a row of ", logits.size());
  // log_softmax in double: x - max - log(sum(exp(x - max))).
  const double peak = logits[first_max(logits)];
  double sum = 0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - peak);
  const double norm = peak + std::log(sum);
  TokenLogprob out;
  out.token = token;
  out.logprob = logits[static_cast<size_t>(token)] - norm;
  const auto n = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(top, 0)), logits.size());
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<long>(n), order.end(),
                    [&](int64_t a, int64_t b) {
                      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                    });
  for (size_t i = 0; i < n; ++i) {
    out.top.emplace_back(order[i], logits[static_cast<size_t>(order[i])] - norm);
  }
  return out;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int64_t Sampler::sample(std::vector<float>& logits, const std::vector<int64_t>& prompt,
                        const std::vector<int64_t>& generated) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  KOLOS_CHECK(vocab > 0, "sampling from an empty row of logits");
  if (params_.repetition_penalty != 1.0) {
    std::set<int64_t> seen(prompt.begin(), prompt.end());
    seen.insert(generated.begin(), generated.end());
    const float p = static_cast<float>(params_.repetition_penalty);
    for (const int64_t t : seen) {
      if (t < 0 || t >= vocab) continue;
      float& l = logits[static_cast<size_t>(t)];
      l = l > 0 ? l / p : l * p;
    }
  }
  if (params_.presence_penalty != 0.0) {
    const std::set<int64_t> seen(generated.begin(), generated.end());
    for (const int64_t t : seen) {
      if (t >= 0 && t < vocab)
        logits[static_cast<size_t>(t)] -= static_cast<float>(params_.presence_penalty);
    }
  }
  if (params_.temperature == 0.0) {
    // The first maximum, as torch.argmax and transformers' greedy search take it.
    return static_cast<int64_t>(first_max(logits));
  }
  // Probabilities at the temperature (in double: a row of 10^5 float
  // exponentials sums without losing the small ones).
  const double t = params_.temperature;
  const float top = logits[first_max(logits)];
  std::vector<double> probs(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    probs[i] = std::exp((static_cast<double>(logits[i]) - top) / t);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;
  // Candidates by descending probability (ties: the lower id first).
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return probs[a] > probs[b]; });
  size_t keep = order.size();
  if (params_.top_k > 0) keep = std::min(keep, static_cast<size_t>(params_.top_k));
  if (params_.min_p > 0) {
    const double floor = params_.min_p * probs[order[0]];
    size_t n = 0;
    while (n < keep && probs[order[n]] >= floor) ++n;
    keep = std::max<size_t>(1, n);
  }
  if (params_.top_p < 1.0) {
    // The fewest most likely tokens whose mass reaches top_p.
    double mass = 0;
    size_t n = 0;
    while (n < keep) {
      mass += probs[order[n++]];
      if (mass >= params_.top_p) break;
    }
    keep = std::max<size_t>(1, n);
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += probs[order[i]];
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs[order[i]];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace kolos::inference
