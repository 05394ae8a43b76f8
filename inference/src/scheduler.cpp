#include "kolos/inference/scheduler.h"

#include <algorithm>
#include <exception>

#include "kolos/core/error.h"

namespace kolos::inference {

int64_t StepPlan::tokens() const {
  int64_t n = 0;
  for (const auto& c : chunks) n += static_cast<int64_t>(c.tokens.size());
  return n;
}

int64_t Scheduler::Sequence::token(int64_t i) const {
  const auto p = static_cast<int64_t>(prompt.size());
  return i < p ? prompt[static_cast<size_t>(i)] : generated[static_cast<size_t>(i - p)];
}

Scheduler::Scheduler(const SchedulerLimits& limits)
    : limits_(limits), allocator_(limits.num_blocks) {
  KOLOS_CHECK(limits.block_size > 0 && limits.max_seqs > 0 && limits.max_step_tokens > 0 &&
                  limits.context > 0 && limits.vocab > 0,
              "scheduler limits: block_size ", limits.block_size, ", max_seqs ", limits.max_seqs,
              ", max_step_tokens ", limits.max_step_tokens, ", context ", limits.context,
              ", vocab ", limits.vocab);
  // One sequence filling the context must fit the pool, or it could never finish.
  KOLOS_CHECK_KIND(kConfig, blocks_for(limits.context, limits.block_size) <= limits.num_blocks,
                   "the KV cache holds ", limits.num_blocks, " blocks of ", limits.block_size,
                   " tokens, fewer than one sequence of the model's context (", limits.context,
                   " tokens) needs (", blocks_for(limits.context, limits.block_size), ")");
}

int64_t Scheduler::add_request(Request request) {
  if (request.prompt.empty())
    throw ConfigError("prompt: empty; a request needs at least one token");
  for (const int64_t t : request.prompt) {
    if (t < 0 || t >= limits_.vocab) {
      throw ConfigError("prompt: token id " + std::to_string(t) +
                        " is outside the vocabulary [0, " + std::to_string(limits_.vocab) + ")");
    }
  }
  const auto n = static_cast<int64_t>(request.prompt.size());
  if (n >= limits_.context) {
    throw ConfigError("prompt: " + std::to_string(n) +
                      " tokens leave no room in the model's context of " +
                      std::to_string(limits_.context) + " tokens (model.seq_len); at most " +
                      std::to_string(limits_.context - 1) + " prompt tokens");
  }
  check_sampling(request.sampling);
  const int64_t id = next_id_++;
  Sequence s{std::move(request.prompt), {}, 0, {}, request.sampling, Sampler(request.sampling)};
  sequences_.emplace(id, std::move(s));
  waiting_.push_back(id);
  return id;
}

Scheduler::Sequence& Scheduler::at(int64_t request) {
  auto it = sequences_.find(request);
  KOLOS_CHECK(it != sequences_.end(), "no request ", request);
  return it->second;
}
const Scheduler::Sequence& Scheduler::at(int64_t request) const {
  auto it = sequences_.find(request);
  KOLOS_CHECK(it != sequences_.end(), "no request ", request);
  return it->second;
}

void Scheduler::release_blocks(Sequence& s) {
  for (const int32_t b : s.blocks) allocator_.release(b);
  s.blocks.clear();
  s.computed = 0;
}

void Scheduler::remove_running(int64_t request) {
  running_.erase(std::remove(running_.begin(), running_.end(), request), running_.end());
}

void Scheduler::cancel(int64_t request) {
  Sequence& s = at(request);
  if (s.finished) return;
  release_blocks(s);
  remove_running(request);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), request), waiting_.end());
  s.finished = true;
}

void Scheduler::preempt(int64_t request, StepPlan& plan) {
  release_blocks(at(request));  // its tokens stay: it is recomputed from them
  remove_running(request);
  waiting_.push_front(request);
  plan.preempted.push_back(request);
  ++preemptions_;
}

ScheduledChunk Scheduler::chunk(int64_t request, int64_t length) {
  Sequence& s = at(request);
  ScheduledChunk c;
  c.request = request;
  c.start = s.computed;
  c.tokens.reserve(static_cast<size_t>(length));
  for (int64_t i = s.computed; i < s.computed + length; ++i) c.tokens.push_back(s.token(i));
  c.sample = s.computed + length == s.length();
  c.blocks = s.blocks;
  return c;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = limits_.max_step_tokens;
  // Running sequences first, in admission order; blocks for them come from
  // the free pool, then from the most recently admitted sequences.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    const int64_t id = running_[i];
    Sequence& s = at(id);
    const int64_t n = std::min(s.length() - s.computed, budget);
    const int64_t need =
        blocks_for(s.computed + n, limits_.block_size) - static_cast<int64_t>(s.blocks.size());
    bool preempted_self = false;
    while (need > allocator_.num_free()) {
      const int64_t victim = running_.back();
      preempt(victim, plan);
      if (victim == id) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;  // it was the last running sequence
    for (int64_t b = 0; b < need; ++b) s.blocks.push_back(allocator_.allocate());
    plan.chunks.push_back(chunk(id, n));
    budget -= n;
    ++i;
  }
  // Then waiting ones, while nothing had to be preempted.
  while (plan.preempted.empty() && budget > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < limits_.max_seqs) {
    const int64_t id = waiting_.front();
    Sequence& s = at(id);
    const int64_t n = std::min(s.length() - s.computed, budget);
    const int64_t need = blocks_for(n, limits_.block_size);
    if (need > allocator_.num_free()) break;
    waiting_.pop_front();
    for (int64_t b = 0; b < need; ++b) s.blocks.push_back(allocator_.allocate());
    running_.push_back(id);
    plan.chunks.push_back(chunk(id, n));
    budget -= n;
  }
  return plan;
}

int64_t Scheduler::sample(int64_t request, std::vector<float>& logits) {
  Sequence& s = at(request);
  if (s.sampling.logprobs < 0) return s.sampler.sample(logits, s.prompt, s.generated);
  const std::vector<float> raw = logits;  // the sampler changes the row in place
  const int64_t token = s.sampler.sample(logits, s.prompt, s.generated);
  // One entry per generated token: complete() appends the token itself.
  s.logprobs.resize(s.generated.size());
  s.logprobs.push_back(log_probabilities(raw, token, s.sampling.logprobs));
  return token;
}

std::vector<int64_t> Scheduler::sample_rows(const std::vector<int64_t>& requests,
                                            const float* logits, int64_t vocab, int threads) {
  const auto n = static_cast<int64_t>(requests.size());
  std::vector<int64_t> tokens(requests.size());
  std::exception_ptr failed;
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(dynamic, 1) if (n > 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      std::vector<float> row(logits + i * vocab, logits + (i + 1) * vocab);
      tokens[static_cast<size_t>(i)] = sample(requests[static_cast<size_t>(i)], row);
    } catch (...) {
#pragma omp critical(kolos_sample_rows)
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  return tokens;
}

std::vector<TokenEvent> Scheduler::complete(const StepPlan& plan,
                                            const std::vector<int64_t>& sampled) {
  std::vector<TokenEvent> events;
  size_t next = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence& s = at(c.request);
    if (s.finished) continue;  // cancelled during the step
    s.computed = c.start + static_cast<int64_t>(c.tokens.size());
    if (!c.sample) continue;
    KOLOS_CHECK(next < sampled.size(), "complete(): fewer sampled tokens than chunks to sample");
    const int64_t token = sampled[next++];
    s.generated.push_back(token);
    TokenEvent e{c.request, token, false, ""};
    const auto& stop = s.sampling.stop_token_ids;
    if (std::find(stop.begin(), stop.end(), token) != stop.end()) {
      e.finish_reason = "stop";
    } else if (static_cast<int64_t>(s.generated.size()) >= s.sampling.max_tokens ||
               s.length() >= limits_.context) {
      e.finish_reason = "length";
    }
    if (!e.finish_reason.empty()) {
      e.finished = true;
      s.finished = true;
      release_blocks(s);
      remove_running(c.request);
    }
    events.push_back(e);
  }
  return events;
}

const std::vector<int64_t>& Scheduler::generated(int64_t request) const {
  return at(request).generated;
}
const std::vector<TokenLogprob>& Scheduler::logprobs(int64_t request) const {
  return at(request).logprobs;
}
bool Scheduler::finished(int64_t request) const { return at(request).finished; }

void Scheduler::forget(int64_t request) {
  KOLOS_CHECK(at(request).finished, "forget(): request ", request, " has not finished");
  sequences_.erase(request);
}

}  // namespace kolos::inference
