// Continuous batching on rank 0: requests join at every step and leave when
// done; prompts are computed in chunks under a per-step token budget
// (chunked prefill); when the KV block pool runs out, the most recently
// admitted sequence is preempted (its blocks freed, its tokens kept) and
// recomputed from its tokens when blocks are free again, so an exhausted
// pool slows a step down and never fails it.
//
// One step, as the engine drives it:
//   plan = schedule()        which tokens of which sequences to compute now,
//                            with the block table each reads and writes
//   (every rank runs the model on plan's tokens; rank 0 has the logits of
//    each chunk whose last token is its sequence's last)
//   sample(id, logits)       for each chunk with `sample`, in plan order
//   complete(plan, tokens)   advances the sequences, appends the sampled
//                            tokens, finishes requests (stop token,
//                            max_tokens, the context) and frees their blocks
//
// Policy: sequences already running are served first, in admission order,
// then waiting ones (preempted ones first, then new ones in arrival order)
// while the budget, max_seqs and free blocks allow; no new sequence is
// admitted in a step that had to preempt.
//
// Not thread-safe; torch-free.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "kolos/inference/block_allocator.h"
#include "kolos/inference/sampler.h"

namespace kolos::inference {

struct Request {
  std::vector<int64_t> prompt;
  SamplingParams sampling;
};

struct SchedulerLimits {
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t max_seqs = 32;
  int64_t max_step_tokens = 256;
  int64_t context = 0;  // positions the model has (model.seq_len)
  int64_t vocab = 0;
};

// Tokens [start, start + tokens.size()) of one sequence, computed in one step.
struct ScheduledChunk {
  int64_t request = 0;
  int64_t start = 0;
  std::vector<int64_t> tokens;
  bool sample = false;          // ends at the sequence's last token: sample the next
  std::vector<int32_t> blocks;  // block table covering positions [0, start + tokens.size())
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<int64_t> preempted;  // requests preempted while planning this step
  int64_t tokens() const;
  bool empty() const { return chunks.empty(); }
};

struct TokenEvent {
  int64_t request = 0;
  int64_t token = 0;
  bool finished = false;
  std::string finish_reason;  // "stop" (a stop token), "length" (max_tokens or the context)
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerLimits& limits);

  // Queues a request; returns its id (0, 1, 2, ... in order). Throws a
  // kolos::Error (kind config) naming the problem: an empty prompt, a token
  // outside the vocabulary, a prompt that leaves no room in the context, a
  // sampling parameter out of range.
  int64_t add_request(Request request);
  // Ends a request now (waiting or running) and frees its blocks.
  void cancel(int64_t request);

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  StepPlan schedule();
  // The next token of `request` from its logits row (its own sampler and
  // random stream).
  int64_t sample(int64_t request, std::vector<float>& logits);
  // sample() for each of `requests`, request i's logits the row
  // logits[i * vocab, (i + 1) * vocab) (left unchanged), the requests spread
  // over up to `threads` threads (the order of the draws does not matter:
  // each stream is its request's own). Their tokens, in the same order.
  std::vector<int64_t> sample_rows(const std::vector<int64_t>& requests, const float* logits,
                                   int64_t vocab, int threads);
  // `sampled`: one token per chunk with `sample`, in plan order.
  std::vector<TokenEvent> complete(const StepPlan& plan, const std::vector<int64_t>& sampled);

  // A request's generated tokens so far (also after it finished, until forget()).
  const std::vector<int64_t>& generated(int64_t request) const;
  // Their log-probabilities, one per generated token, when the request's
  // sampling asked for them (SamplingParams::logprobs >= 0); else empty.
  const std::vector<TokenLogprob>& logprobs(int64_t request) const;
  bool finished(int64_t request) const;
  void forget(int64_t request);  // drops a finished request's record

  const BlockAllocator& allocator() const { return allocator_; }
  const SchedulerLimits& limits() const { return limits_; }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t preemptions() const { return preemptions_; }

 private:
  struct Sequence {
    std::vector<int64_t> prompt;
    std::vector<int64_t> generated;
    int64_t computed = 0;  // tokens whose K/V are in the cache
    std::vector<int32_t> blocks;
    SamplingParams sampling;
    Sampler sampler;
    bool finished = false;
    std::vector<TokenLogprob> logprobs;
    int64_t length() const { return static_cast<int64_t>(prompt.size() + generated.size()); }
    int64_t token(int64_t i) const;
  };
  Sequence& at(int64_t request);
  const Sequence& at(int64_t request) const;
  void preempt(int64_t request, StepPlan& plan);
  void release_blocks(Sequence& sequence);
  void remove_running(int64_t request);
  ScheduledChunk chunk(int64_t request, int64_t length);

  SchedulerLimits limits_;
  BlockAllocator allocator_;
  std::map<int64_t, Sequence> sequences_;
  std::vector<int64_t> running_;  // admission order
  std::deque<int64_t> waiting_;
  int64_t next_id_ = 0;
  int64_t preemptions_ = 0;
};

}  // namespace kolos::inference
