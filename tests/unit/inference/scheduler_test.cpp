// The scheduler and block allocator under a stand-in model: each step, the
// "cache" rows the block tables name are written with (request, position,
// token) and every row a chunk reads is checked to hold its own sequence's
// token at that position; the "logits" are a hash of the tokens read back.
// So a wrong block table, a block shared by two live sequences, or a
// preempted sequence recomputed wrongly changes the output or fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/inference/block_allocator.h"
#include "kolos/inference/sampler.h"
#include "kolos/inference/scheduler.h"

namespace kolos::inference {
namespace {

constexpr int64_t kVocab = 50;

struct Row {
  int64_t request = -1, position = -1, token = -1;
};

// Runs every request to completion; returns each request's generated tokens.
struct Harness {
  Scheduler scheduler;
  std::vector<Row> cache;
  int64_t steps = 0;
  int64_t max_step_tokens_seen = 0;

  explicit Harness(const SchedulerLimits& limits)
      : scheduler(limits), cache(static_cast<size_t>(limits.num_blocks * limits.block_size)) {}

  // logits of the next token after positions [0, ctx) as read from the cache
  std::vector<float> logits(int64_t request, int64_t context, const std::vector<int32_t>& blocks) {
    const int64_t bs = scheduler.limits().block_size;
    uint64_t h = 1469598103934665603ull;
    for (int64_t p = 0; p < context; ++p) {
      const Row& r = cache[static_cast<size_t>(blocks[static_cast<size_t>(p / bs)] * bs + p % bs)];
      EXPECT_EQ(r.request, request) << "position " << p;
      EXPECT_EQ(r.position, p);
      h = (h ^ static_cast<uint64_t>(r.token + 7)) * 1099511628211ull;
    }
    std::vector<float> out(kVocab);
    std::mt19937_64 g(h);
    for (auto& x : out) x = std::uniform_real_distribution<float>(-3, 3)(g);
    return out;
  }

  std::vector<TokenEvent> step() {
    StepPlan plan = scheduler.schedule();
    ++steps;
    EXPECT_FALSE(plan.empty());
    EXPECT_LE(plan.tokens(), scheduler.limits().max_step_tokens);
    EXPECT_LE(static_cast<int64_t>(plan.chunks.size()), scheduler.limits().max_seqs);
    max_step_tokens_seen = std::max(max_step_tokens_seen, plan.tokens());
    const int64_t bs = scheduler.limits().block_size;
    std::set<int32_t> used;
    for (const auto& c : plan.chunks) {
      for (const int32_t b : c.blocks) {
        EXPECT_TRUE(used.insert(b).second) << "block " << b << " in two live tables";
        EXPECT_EQ(scheduler.allocator().ref_count(b), 1);
      }
      EXPECT_GE(static_cast<int64_t>(c.blocks.size()) * bs,
                c.start + static_cast<int64_t>(c.tokens.size()));
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        const int64_t p = c.start + static_cast<int64_t>(i);
        cache[static_cast<size_t>(c.blocks[static_cast<size_t>(p / bs)] * bs + p % bs)] =
            Row{c.request, p, c.tokens[i]};
      }
    }
    std::vector<int64_t> sampled;
    for (const auto& c : plan.chunks) {
      if (!c.sample) continue;
      std::vector<float> l =
          logits(c.request, c.start + static_cast<int64_t>(c.tokens.size()), c.blocks);
      sampled.push_back(scheduler.sample(c.request, l));
    }
    return scheduler.complete(plan, sampled);
  }

  void run() {
    while (scheduler.has_work()) step();
  }
};

Request request(std::vector<int64_t> prompt, int64_t max_tokens, double temperature = 0,
                uint64_t seed = 0) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

std::vector<int64_t> random_prompt(std::mt19937_64& g, int64_t length) {
  std::vector<int64_t> p(static_cast<size_t>(length));
  for (auto& t : p) t = static_cast<int64_t>(g() % kVocab);
  return p;
}

TEST(BlockAllocator, AllocatesSharesAndFrees) {
  BlockAllocator a(3);
  EXPECT_EQ(a.allocate(), 0);
  EXPECT_EQ(a.allocate(), 1);
  EXPECT_EQ(a.allocate(), 2);
  EXPECT_EQ(a.allocate(), -1);  // exhausted: no exception, no growth
  a.share(1);
  EXPECT_EQ(a.ref_count(1), 2);
  a.release(1);
  EXPECT_EQ(a.num_free(), 0);
  a.release(1);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.allocate(), 1);
  EXPECT_THROW(a.share(7), Error);
  a.release(0);
  EXPECT_THROW(a.release(0), Error);  // a double free is a bug, said at once
}

TEST(Scheduler, RefusesBadRequests) {
  Scheduler s({/*num_blocks=*/8, /*block_size=*/4, 4, 16, /*context=*/32, kVocab});
  EXPECT_THROW(s.add_request(request({}, 4)), ConfigError);
  EXPECT_THROW(s.add_request(request({1, kVocab}, 4)), ConfigError);
  EXPECT_THROW(s.add_request(request(std::vector<int64_t>(32, 1), 4)), ConfigError);
  Request nan = request({1}, 4, std::numeric_limits<double>::quiet_NaN());
  EXPECT_THROW(s.add_request(nan), ConfigError);
  Request top_p = request({1}, 4);
  top_p.sampling.top_p = 0;
  EXPECT_THROW(s.add_request(top_p), ConfigError);
  // A pool smaller than one context could never finish a long request.
  EXPECT_THROW(Scheduler({7, 4, 4, 16, 32, kVocab}), ConfigError);
}

TEST(Scheduler, ChunkedPrefillKeepsTheBudget) {
  Harness h({64, 4, 8, /*max_step_tokens=*/10, 64, kVocab});
  std::mt19937_64 g(1);
  const int64_t id = h.scheduler.add_request(request(random_prompt(g, 37), 5));
  h.run();
  EXPECT_EQ(h.scheduler.generated(id).size(), 5u);
  EXPECT_EQ(h.max_step_tokens_seen, 10);
  EXPECT_GE(h.steps, 4 + 4);  // 37 prompt tokens in chunks of 10, then 4 decodes
  EXPECT_EQ(h.scheduler.allocator().num_used(), 0);
}

TEST(Scheduler, StopsAtStopTokenMaxTokensAndContext) {
  Harness h({16, 4, 8, 64, /*context=*/12, kVocab});
  const int64_t a = h.scheduler.add_request(request({1, 2, 3}, 100));  // the context ends it
  h.run();
  EXPECT_EQ(h.scheduler.generated(a).size(), 9u);
  const auto first = h.scheduler.generated(a).front();
  Request r = request({1, 2, 3}, 100);
  r.sampling.stop_token_ids = {first};
  const int64_t b = h.scheduler.add_request(r);
  std::vector<TokenEvent> events;
  while (h.scheduler.has_work()) {
    for (auto& e : h.step()) events.push_back(e);
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].request, b);
  EXPECT_EQ(events[0].finish_reason, "stop");
  EXPECT_EQ(h.scheduler.allocator().num_used(), 0);
}

// Every request's output, served among others that join and leave at every
// step with a pool so small that sequences are preempted and recomputed,
// equals its output served alone; sampled requests too (seeded).
TEST(Scheduler, BatchedAndPreemptedEqualsAlone) {
  std::mt19937_64 g(7);
  struct Spec {
    std::vector<int64_t> prompt;
    int64_t max_tokens;
    double temperature;
    uint64_t seed;
  };
  std::vector<Spec> specs;
  for (int i = 0; i < 60; ++i) {
    specs.push_back({random_prompt(g, 1 + static_cast<int64_t>(g() % 30)),
                     1 + static_cast<int64_t>(g() % 20), i % 3 == 0 ? 0.0 : 0.8,
                     static_cast<uint64_t>(i * 11)});
  }
  const SchedulerLimits tiny{
      /*num_blocks=*/14,      /*block_size=*/4, /*max_seqs=*/6,
      /*max_step_tokens=*/12, /*context=*/52,   kVocab};
  std::vector<std::vector<int64_t>> alone;
  for (const auto& s : specs) {
    Harness h(SchedulerLimits{64, 4, 1, 64, 52, kVocab});
    const int64_t id =
        h.scheduler.add_request(request(s.prompt, s.max_tokens, s.temperature, s.seed));
    h.run();
    alone.push_back(h.scheduler.generated(id));
  }
  Harness h(tiny);
  std::map<int64_t, size_t> spec_of;
  size_t next = 0;
  std::mt19937_64 arrivals(3);
  int64_t cancelled = -1;
  while (next < specs.size() || h.scheduler.has_work()) {
    // 0-3 requests join at every step.
    for (int64_t k = static_cast<int64_t>(arrivals() % 4); k > 0 && next < specs.size(); --k) {
      const Spec& s = specs[next];
      spec_of[h.scheduler.add_request(request(s.prompt, s.max_tokens, s.temperature, s.seed))] =
          next++;
    }
    if (cancelled < 0 && next > 20 && h.scheduler.num_running() > 1) {
      // One cancellation mid-flight: its blocks come back.
      cancelled = spec_of.rbegin()->first;
      h.scheduler.cancel(cancelled);
    }
    if (h.scheduler.has_work()) h.step();
  }
  EXPECT_GT(h.scheduler.preemptions(), 0) << "the pool was meant to force preemption";
  for (const auto& [id, index] : spec_of) {
    if (id == cancelled) continue;
    EXPECT_EQ(h.scheduler.generated(id), alone[index]) << "request " << index;
  }
  EXPECT_EQ(h.scheduler.allocator().num_used(), 0) << "every KV block is free at the end";
}

TEST(Scheduler, ManyRandomRequestsLeaveEveryBlockFree) {
  std::mt19937_64 g(11);
  Harness h({40, 8, 16, 48, 96, kVocab});
  std::vector<int64_t> live;
  for (int i = 0; i < 1000; ++i) {
    live.push_back(h.scheduler.add_request(
        request(random_prompt(g, 1 + static_cast<int64_t>(g() % 60)),
                1 + static_cast<int64_t>(g() % 30), 0.7, static_cast<uint64_t>(i))));
    if (g() % 5 == 0) h.scheduler.cancel(live[g() % live.size()]);
    if (h.scheduler.has_work()) h.step();
  }
  h.run();
  EXPECT_EQ(h.scheduler.num_running(), 0);
  EXPECT_EQ(h.scheduler.allocator().num_used(), 0);
}

TEST(Sampler, GreedyFiltersAndSeeds) {
  const std::vector<float> row = {0.1f, 2.0f, 1.9f, -1.0f, 2.0f};
  auto draw = [&](SamplingParams p, int n) {
    Sampler s(p);
    std::vector<int64_t> out;
    for (int i = 0; i < n; ++i) {
      std::vector<float> l = row;
      out.push_back(s.sample(l, {}, out));
    }
    return out;
  };
  SamplingParams greedy;
  EXPECT_EQ(draw(greedy, 1)[0], 1);  // the first maximum
  SamplingParams hot;
  hot.temperature = 1.0;
  hot.seed = 5;
  EXPECT_EQ(draw(hot, 50), draw(hot, 50));  // same seed, same tokens
  hot.seed = 6;
  SamplingParams other = hot;
  other.seed = 5;
  EXPECT_NE(draw(hot, 50), draw(other, 50));
  SamplingParams k1 = hot;
  k1.top_k = 1;
  EXPECT_EQ(draw(k1, 20), std::vector<int64_t>(20, 1));
  SamplingParams p_small = hot;
  p_small.top_p = 0.01;
  EXPECT_EQ(draw(p_small, 20), std::vector<int64_t>(20, 1));
  SamplingParams min_p = hot;
  min_p.min_p = 0.95;  // keeps 1, 4 (equal) and 2 (e^-0.1 = 0.905 < 0.95: dropped)
  for (int64_t t : draw(min_p, 50)) EXPECT_TRUE(t == 1 || t == 4) << t;
  SamplingParams k3 = hot;
  k3.top_k = 3;
  for (int64_t t : draw(k3, 50)) EXPECT_TRUE(t == 1 || t == 2 || t == 4) << t;
  // Presence penalty: a token once generated is pushed below the others.
  SamplingParams presence;
  presence.presence_penalty = 5;
  EXPECT_EQ(draw(presence, 3), (std::vector<int64_t>{1, 4, 2}));
  // Repetition penalty on the prompt: positive logits divided.
  SamplingParams repetition;
  repetition.repetition_penalty = 2.0;
  Sampler s(repetition);
  std::vector<float> l = row;
  EXPECT_EQ(s.sample(l, {1, 4}, {}), 2);
  EXPECT_FLOAT_EQ(l[1], 1.0f);
}

// Greedy takes std::max_element's answer on any row: the first of equal
// maxima wherever they fall among the sampler's eight lanes and the tail,
// NaNs passed over unless the row starts with one, -0 and +0 equal.
TEST(Sampler, GreedyIsTheFirstMaximum) {
  std::mt19937_64 g(3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto expect_first_max = [](std::vector<float> row, const std::string& what) {
    const auto expected = std::max_element(row.begin(), row.end()) - row.begin();
    Sampler s{SamplingParams{}};
    EXPECT_EQ(s.sample(row, {}, {}), expected) << what << ", " << row.size() << " logits";
  };
  for (const size_t n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 32000}) {
    std::vector<float> row(n);
    for (float& x : row) x = static_cast<float>(g() % 1000) / 10.0f - 50.0f;
    expect_first_max(row, "random");
    // Two equal maxima, in every pair of lanes and in the tail.
    for (size_t a = 0; a < std::min<size_t>(n, 20); ++a) {
      for (size_t b = a + 1; b < std::min<size_t>(n, 20); ++b) {
        std::vector<float> tie = row;
        tie[a] = tie[b] = 100.0f;
        expect_first_max(tie, "maxima at " + std::to_string(a) + " and " + std::to_string(b));
      }
    }
    std::vector<float> last = row;
    last[n - 1] = 100.0f;
    expect_first_max(last, "the maximum last");
    std::vector<float> flat(n, -inf);
    expect_first_max(flat, "all -inf");
    std::vector<float> zeros(n, -0.0f);
    zeros[n / 2] = 0.0f;
    expect_first_max(zeros, "-0 and +0");
    std::vector<float> with_nan = row;
    with_nan[n / 2] = nan;
    expect_first_max(with_nan, "a NaN inside");
    std::vector<float> leading_nan = row;
    leading_nan[0] = nan;
    expect_first_max(leading_nan, "a NaN first");
  }
}

// The filters' kept tokens as their definition reads: the probabilities at
// the temperature sorted (descending, ties: the lower id first), then top_k,
// min_p and top_p each a prefix of that order.
std::set<int64_t> reference_kept(const std::vector<float>& logits, const SamplingParams& p) {
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    sum += probs[i] = std::exp((static_cast<double>(logits[i]) - top) / p.temperature);
  }
  for (double& x : probs) x /= sum;
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return probs[a] > probs[b]; });
  size_t keep = order.size();
  if (p.top_k > 0) keep = std::min(keep, static_cast<size_t>(p.top_k));
  if (p.min_p > 0) {
    size_t n = 0;
    while (n < keep && probs[order[n]] >= p.min_p * probs[order[0]]) ++n;
    keep = std::max<size_t>(1, n);
  }
  if (p.top_p < 1.0) {
    double mass = 0;
    size_t n = 0;
    while (n < keep) {
      mass += probs[order[n++]];
      if (mass >= p.top_p) break;
    }
    keep = std::max<size_t>(1, n);
  }
  return std::set<int64_t>(order.begin(), order.begin() + static_cast<long>(keep));
}

// Every draw is one of the kept tokens, on rows where the tokens just past
// each filter's boundary hold most of the mass (so that keeping one too many
// shows within a few draws) and on random rows of 32000 and 4000 logits
// with ties.
TEST(Sampler, FiltersKeepTheirPrefix) {
  std::mt19937_64 g(5);
  std::vector<std::vector<float>> rows = {
      {10, 9, 9, 9, 9, 0, 0},              // top_k 2: 0 and the first 9 (id 1), not 2-4
      {0, 9, 9, 9, 10, 8, 8, 8, 8, 8, 8},  // ties around every boundary
  };
  for (int r = 0; r < 3; ++r) {
    std::vector<float> row(r == 0 ? 32000 : 4000);
    for (float& x : row)
      x = static_cast<float>(g() % (r == 0 ? 4000 : 40)) / (r == 2 ? 2.f : 200.f);
    rows.push_back(row);
  }
  for (const auto& row : rows) {
    for (const int64_t k : {0, 1, 2, 40}) {
      for (const double min_p : {0.0, 0.05, 0.5}) {
        for (const double top_p : {1.0, 0.95, 0.5, 0.01}) {
          for (const double temperature : {0.7, 1.3}) {
            SamplingParams p;
            p.temperature = temperature;
            p.top_k = k;
            p.min_p = min_p;
            p.top_p = top_p;
            const std::set<int64_t> kept = reference_kept(row, p);
            std::set<int64_t> drawn;
            for (uint64_t seed = 0; seed < 16; ++seed) {
              p.seed = seed;
              Sampler s(p);
              std::vector<float> l = row;
              const int64_t t = s.sample(l, {}, {});
              drawn.insert(t);
              ASSERT_TRUE(kept.count(t))
                  << "token " << t << " is not kept: top_k " << k << ", min_p " << min_p
                  << ", top_p " << top_p << ", temperature " << temperature << ", " << row.size()
                  << " logits";
            }
            if (kept.size() == 1) EXPECT_EQ(drawn, kept);
          }
        }
      }
    }
  }
}

// Draws follow the kept tokens' renormalised probabilities: 20000 from one
// stream on a row of six, without a filter and with top_k 3 (within 0.015
// of each probability; one standard deviation is under 0.0036).
TEST(Sampler, DrawsFollowTheProbabilities) {
  const std::vector<float> row = {1.0f, 2.0f, 0.5f, 1.5f, -1.0f, 2.0f};
  for (const int64_t k : {0, 3}) {
    SamplingParams p;
    p.temperature = 0.9;
    p.top_k = k;
    p.seed = 9;
    std::vector<double> expected(row.size(), 0.0);
    double sum = 0;
    for (size_t i = 0; i < row.size(); ++i) {
      const bool kept = k == 0 || i == 1 || i == 5 || i == 3;  // the three largest
      if (kept) sum += expected[i] = std::exp(row[i] / p.temperature);
    }
    std::vector<double> seen(row.size(), 0.0);
    Sampler s(p);
    const int draws = 20000;
    for (int i = 0; i < draws; ++i) {
      std::vector<float> l = row;
      seen[static_cast<size_t>(s.sample(l, {}, {}))] += 1.0 / draws;
    }
    for (size_t i = 0; i < row.size(); ++i) {
      EXPECT_NEAR(seen[i], expected[i] / sum, 0.015) << "token " << i << ", top_k " << k;
    }
  }
}

// Log-probabilities are log_softmax of the raw row: before the penalties,
// the temperature and the filters; the top ones by descending value, the
// lower id first on a tie; one per generated token, also across preemption.
TEST(Sampler, LogProbabilities) {
  const std::vector<float> row = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  double norm = 0;
  for (const float x : row) norm += std::exp(static_cast<double>(x));
  norm = std::log(norm);
  const TokenLogprob lp = log_probabilities(row, 4, 3);
  EXPECT_EQ(lp.token, 4);
  EXPECT_NEAR(lp.logprob, 0.5 - norm, 1e-12);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);
  EXPECT_EQ(lp.top[1].first, 2);
  EXPECT_EQ(lp.top[2].first, 0);
  EXPECT_NEAR(lp.top[2].second, 1.0 - norm, 1e-12);
  EXPECT_TRUE(log_probabilities(row, 0, 0).top.empty());
  EXPECT_EQ(log_probabilities(row, 0, 20).top.size(), row.size());

  SamplingParams bad;
  bad.logprobs = 21;
  EXPECT_THROW(check_sampling(bad), ConfigError);

  // Through the scheduler: penalties and temperature change what is
  // sampled, not the reported distribution.
  Harness h({64, 4, 8, 16, 64, kVocab});
  Request r = request({1, 2, 3, 4, 5}, 12, /*temperature=*/0.7);
  r.sampling.repetition_penalty = 1.3;
  r.sampling.logprobs = 2;
  const int64_t id = h.scheduler.add_request(r);
  const int64_t plain = h.scheduler.add_request(request({1, 2}, 3));
  h.run();
  const auto& tokens = h.scheduler.generated(id);
  const auto& lps = h.scheduler.logprobs(id);
  ASSERT_EQ(lps.size(), tokens.size());
  for (size_t i = 0; i < lps.size(); ++i) {
    EXPECT_EQ(lps[i].token, tokens[i]);
    EXPECT_LE(lps[i].logprob, lps[i].top[0].second);
    EXPECT_EQ(lps[i].top.size(), 2u);
  }
  EXPECT_TRUE(h.scheduler.logprobs(plain).empty());
}

}  // namespace
}  // namespace kolos::inference
