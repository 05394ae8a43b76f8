// `kolos serve`'s server state on rank 0 (Server): the engine and its
// settings, the tokenizer and chat template, the inbox between the HTTP
// handler threads and the engine loop, and the metrics. Its parts are
// defined by topic:
//   serve_requests.cpp  a request body parsed and checked into a Job
//   serve_chat.cpp      the chat template: chosen, probed, rendered
//   serve_loop.cpp      submitting a Job and the engine loop that runs it
//   serve_metrics.cpp   /metrics's text
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kolos/inference/config.h"
#include "kolos/inference/engine.h"
#include "kolos/tokenizer/chat_template.h"
#include "kolos/tokenizer/tokenizer.h"
#include "serve_metrics.h"
#include "serve_requests.h"

namespace kolos::cli::serve {

// Set by SIGTERM or SIGINT: stop accepting, finish what is in flight.
extern std::atomic<bool> g_stop;

struct Server {
  inference::InferenceEngine& engine;
  inference::InferenceConfig settings;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::string model_name;
  int64_t max_queue = 256;
  Metrics metrics;
  std::mutex inbox_mutex;
  std::condition_variable inbox_changed;
  std::deque<JobPtr> inbox;
  std::atomic<int64_t> queued{0};     // in the inbox
  std::atomic<int64_t> scheduled{0};  // waiting in the scheduler (new or preempted)
  // Chat: the template (immutable, safe from any thread), or why there is none.
  std::optional<tokenizer::ChatTemplate> chat;
  std::string chat_missing;
  std::string bos_token, eos_token;
  std::vector<int64_t> turn_end_ids;  // special tokens the template ends a turn with
  std::atomic<int64_t> next_id{0};    // the number in the next completion's id

  // The text of a request's `messages` rendered with the chat template.
  std::string render_chat(const json& body) const;

  static json parse_body(const std::string& text);

  // Parses and checks a request body (of /v1/completions, or with `chat` of
  // /v1/chat/completions); the request's token ids and sampling.
  JobPtr parse(const std::string& text, bool chat_request);

  // Handler thread: queue the job, wait until the loop admitted or refused it.
  void submit(const JobPtr& job);

  // The engine loop (main thread). Returns when stopped and drained.
  void loop();

  void finish(Job& job, const std::string& reason);

  void deliver(inference::Scheduler& scheduler, std::map<int64_t, JobPtr>& live,
               const inference::TokenEvent& e);

  std::string metrics_text() const;
};

// The chat template: inference.chat_template (refused at start when it is
// missing, unreadable or outside the supported subset), else the tokenizer's
// own (when outside the subset, chat requests are answered 400 with the
// reason and the rest of the server serves). Then the special tokens the
// template ends an assistant turn with, found by rendering a probe
// conversation: chat requests stop at them.
void load_chat_template(Server& server, const inference::InferenceConfig& settings);

}  // namespace kolos::cli::serve
