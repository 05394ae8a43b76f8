#include "kolos/inference/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
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
// a fifth of std::max_element's time over a row of 32000 logits, which the
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

// A row of probabilities in descending order (ties: the lower id first),
// sorted only where the filters look. Sorting the whole row cost more than
// a decoding step's forward (3 ms a row of 32000 here), for filters that
// read a few dozen tokens of it. The ids are grouped by the leading 16 bits
// of their probability (sign, exponent and 4 bits of the fraction: for
// numbers >= 0 the bits order as the values do, so every probability of a
// group is above every one of the next), each group in id order; a group is
// sorted only when a boundary falls inside it.
class GroupedRow {
 public:
  void reset(const std::vector<double>& probs) {
    probs_ = &probs;
    const size_t n = probs.size();
    ids_.resize(n);
    group_of_.resize(n);
    std::fill(begin_.begin(), begin_.end(), 0);
    for (size_t i = 0; i < n; ++i) {
      uint64_t bits;
      std::memcpy(&bits, &probs[i], sizeof bits);
      const uint64_t lead = bits >> 48;  // 0 to kOne for p in [0, 1]; a NaN above
      group_of_[i] = static_cast<uint16_t>(lead > kOne ? kGroups - 1 : kOne - lead);
      ++begin_[group_of_[i] + 1];
    }
    for (size_t g = 1; g <= kGroups; ++g) begin_[g] += begin_[g - 1];
    std::copy(begin_.begin(), begin_.end() - 1, next_.begin());
    for (size_t i = 0; i < n; ++i) ids_[next_[group_of_[i]]++] = static_cast<int64_t>(i);
    sorted_.assign(kGroups, false);
  }
  // The id at place i of the order.
  int64_t nth(size_t i) {
    KOLOS_CHECK(i < ids_.size(), "the sampler's order: place ", i, " of ", ids_.size(), " ids");
    const auto g =
        static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), i) - begin_.begin() - 1);
    sort_group(g);
    return ids_[i];
  }
  // The fewest first ids of the order whose probabilities sum to `mass` or
  // more; all of them if none do.
  size_t prefix_reaching(double mass) {
    double sum = 0;
    for (size_t g = 0; g < kGroups; ++g) {
      if (begin_[g] == begin_[g + 1]) continue;
      double in_group = 0;
      for (uint32_t i = begin_[g]; i < begin_[g + 1]; ++i) in_group += p(ids_[i]);
      if (sum + in_group < mass) {
        sum += in_group;
        continue;
      }
      sort_group(g);
      for (uint32_t i = begin_[g]; i < begin_[g + 1]; ++i) {
        sum += p(ids_[i]);
        if (sum >= mass) return i + 1;
      }
    }
    return ids_.size();
  }
  // Whether id comes before (or is) `last` in the order.
  bool up_to(int64_t id, int64_t last) const {
    return p(id) > p(last) || (p(id) == p(last) && id <= last);
  }

 private:
  static constexpr uint64_t kOne = 0x3FF0;  // the leading 16 bits of 1.0
  static constexpr size_t kGroups = kOne + 2;
  double p(int64_t id) const { return (*probs_)[static_cast<size_t>(id)]; }
  void sort_group(size_t g) {
    if (sorted_[g]) return;
    std::sort(ids_.begin() + begin_[g], ids_.begin() + begin_[g + 1],
              [this](int64_t a, int64_t b) { return p(a) > p(b) || (p(a) == p(b) && a < b); });
    sorted_[g] = true;
  }
  const std::vector<double>* probs_ = nullptr;
  std::vector<int64_t> ids_;        // grouped; a group sorted once a boundary falls in it
  std::vector<uint16_t> group_of_;  // each id's group
  std::array<uint32_t, kGroups + 1> begin_{};  // group g: ids_[begin_[g], begin_[g + 1])
  std::array<uint32_t, kGroups> next_{};       // where reset() puts each group's next id
  std::vector<bool> sorted_;
};

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
  const size_t best = first_max(logits);
  const float top = logits[best];
  thread_local std::vector<double> probs;
  probs.resize(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    probs[i] = std::exp((static_cast<double>(logits[i]) - top) / t);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;
  // The filters keep the first `keep` tokens of the row in descending
  // order (ties: the lower id first): top_k the first k; min_p those at
  // least min_p times the most likely one's probability; top_p the fewest
  // whose mass reaches top_p; each within the ones before.
  size_t keep = probs.size();
  thread_local GroupedRow order;
  const bool filtered = params_.top_k > 0 || params_.min_p > 0 || params_.top_p < 1.0;
  if (filtered) order.reset(probs);
  if (params_.top_k > 0) keep = std::min(keep, static_cast<size_t>(params_.top_k));
  if (params_.min_p > 0) {
    const double floor = params_.min_p * probs[best];
    const auto n = static_cast<size_t>(
        std::count_if(probs.begin(), probs.end(), [&](double p) { return p >= floor; }));
    keep = std::max<size_t>(1, std::min(keep, n));
  }
  if (params_.top_p < 1.0) {
    keep = std::max<size_t>(1, std::min(keep, order.prefix_reaching(params_.top_p)));
  }
  // One draw over the kept tokens, walked in id order (the same
  // distribution as walked most likely first, with no sort).
  const int64_t last = keep < probs.size() ? order.nth(keep - 1) : -1;
  auto kept = [&](size_t i) { return last < 0 || order.up_to(static_cast<int64_t>(i), last); };
  double mass = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (kept(i)) mass += probs[i];
  }
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * mass;
  double acc = 0;
  int64_t chosen = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (!kept(i)) continue;
    chosen = static_cast<int64_t>(i);
    acc += probs[i];
    if (u < acc) break;
  }
  return chosen;
}

}  // namespace kolos::inference
