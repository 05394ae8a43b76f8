// `kolos serve`: /v1/completions and /v1/chat/completions (plain and
// server-sent events, optional logprobs), /v1/chat/render, /v1/models,
// /tokenize, /detokenize, /health and /metrics over the inference engine, on
// rank 0. Chat prompts are rendered with the model's chat template
// (kolos/tokenizer/chat_template.h).
//
// Threads on rank 0: cpp-httplib's handler threads parse and check a
// request, hand it to the engine loop through an inbox and wait on the
// request's own channel; the main thread runs the engine loop (it alone
// touches the scheduler and the engine): it admits queued requests, runs a
// step, and delivers each sampled token to its request's channel. A client
// that goes away mid-stream cancels its request (its blocks are freed at
// once). With several ranks the others follow the steps; between requests
// rank 0 sends an idle step every half second, so that none waits in one
// broadcast past the communication timeout. SIGTERM or SIGINT: stop
// accepting, finish what is in flight, release the other ranks, exit 0.
#include "serve_command.h"

#if !defined(KOLOS_WITH_HTTPLIB)
#include "kolos/core/error.h"

namespace kolos::cli {
int serve_command(const std::vector<std::string>&, int, char**) {
  throw UsageError(
      "kolos serve: this kolos was built without cpp-httplib; install libcpp-httplib-dev "
      "(scripts/install-deps.sh) and configure again");
}
}  // namespace kolos::cli
#else
#include <httplib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "generate_command.h"
#include "kolos/config.h"
#include "kolos/core/error.h"
#include "kolos/core/runtime.h"
#include "kolos/core/settings.h"
#include "kolos/inference/engine.h"
#include "kolos/tokenizer/chat_template.h"
#include "launch.h"

namespace kolos::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kServeUsage =
    R"(usage: kolos serve CKPT [--host HOST] [--port PORT] [options] [CONFIG.toml]

  CKPT                     a kolos checkpoint or a Hugging Face directory (as kolos generate)
  --host HOST              address to listen on (default 127.0.0.1)
  --port PORT              port (default 8000; 0: any free port, printed on stderr)
  --model NAME             the model name requests may give (default: CKPT's directory name)
  --max-queue N            requests waiting at most (not yet in a step, or preempted); more are
                           refused with 429 (default 256)
  --tokenizer PATH         tokenizer.json or tokenizer.model (inference.tokenizer)
  --chat-template PATH     a Jinja2 chat template file (inference.chat_template; default: the
                           tokenizer_config.json's chat_template next to the tokenizer)
  -n, --np RANKS           run on RANKS ranks through mpirun (tensor parallel, pipeline stages)
  --mpirun PATH            the mpirun to use with -n
  --set inference.KEY=V    override a key of [inference]
  CONFIG.toml              a file with an [inference] section (and [plugins] path)

Endpoints: POST /v1/completions (OpenAI's fields: prompt, max_tokens, temperature, top_p, top_k,
min_p, presence_penalty, repetition_penalty, seed, stop, stream, logprobs), POST
/v1/chat/completions (messages, the same fields, logprobs and top_logprobs), POST /v1/chat/render
{"messages"} (the rendered prompt), GET /v1/models, POST /tokenize {"prompt"}, POST /detokenize
{"tokens"}, GET /health, GET /metrics.
SIGTERM stops accepting, finishes the requests in flight and exits 0.
)";

std::atomic<bool> g_stop{false};
void on_serve_stop_signal(int) { g_stop.store(true); }

// A 4xx answer in OpenAI's shape.
struct ApiError {
  int status = 400;
  std::string message, param, type = "invalid_request_error", code;
};
std::string error_body(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return j.dump();
}

// One request between its handler thread and the engine loop.
struct Job {
  std::vector<int64_t> prompt;
  inference::SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool chat = false;  // /v1/chat/completions
  // Filled by the engine loop.
  std::mutex mutex;
  std::condition_variable changed;
  bool admitted = false, done = false;
  ApiError rejected;  // status 0: accepted
  std::vector<int64_t> tokens;
  std::vector<inference::TokenLogprob> logprobs;  // one per token when asked for
  std::string text;  // decoded (with a tokenizer), cut at a stop string
  std::string finish_reason;
  std::atomic<bool> cancel{false};                            // the client went away
  std::chrono::steady_clock::time_point arrived, last_token;  // the engine loop's
};
using JobPtr = std::shared_ptr<Job>;

// A Prometheus histogram of seconds (cumulative buckets, sum, count).
class Histogram {
 public:
  void observe(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < kBounds.size(); ++i) counts_[i] += seconds <= kBounds[i] ? 1 : 0;
    sum_ += seconds;
    ++count_;
  }
  void write(std::ostream& out, const char* name, const char* help) const {
    std::lock_guard<std::mutex> lock(mutex_);
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
    for (size_t i = 0; i < kBounds.size(); ++i) {
      out << name << "_bucket{le=\"" << kBounds[i] << "\"} " << counts_[i] << "\n";
    }
    out << name << "_bucket{le=\"+Inf\"} " << count_ << "\n"
        << name << "_sum " << sum_ << "\n"
        << name << "_count " << count_ << "\n";
  }

 private:
  static constexpr std::array<double, 12> kBounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,   1,    2.5,   5,    10};
  mutable std::mutex mutex_;
  std::array<int64_t, 12> counts_{};
  double sum_ = 0;
  int64_t count_ = 0;
};

struct Metrics {
  std::atomic<int64_t> requests{0}, rejected{0}, prompt_tokens{0}, generated_tokens{0};
  std::atomic<int64_t> running{0}, waiting{0}, blocks_used{0}, blocks_total{0}, preemptions{0};
  Histogram ttft;         // arrival to first token
  Histogram inter_token;  // between consecutive tokens of a request
};

double number(const json& body, const char* key, double fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_number()) {
    throw ApiError{400, std::string("`") + key + "` must be a number", key};
  }
  const double v = body[key].get<double>();
  if (!std::isfinite(v)) throw ApiError{400, std::string("`") + key + "` must be finite", key};
  return v;
}
int64_t integer(const json& body, const char* key, int64_t fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_number_integer()) {
    throw ApiError{400, std::string("`") + key + "` must be an integer", key};
  }
  return body[key].get<int64_t>();
}

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

  // The text of a request's `messages` rendered with the chat template.
  std::string render_chat(const json& body) const {
    if (!chat) throw ApiError{400, chat_missing, "messages"};
    if (!body.contains("messages")) throw ApiError{400, "`messages` is required", "messages"};
    const json& messages = body["messages"];
    if (!messages.is_array()) {
      throw ApiError{400, "`messages` must be an array of {\"role\", \"content\"} objects",
                     "messages"};
    }
    if (messages.empty()) throw ApiError{400, "`messages` is empty", "messages"};
    tokenizer::ChatTemplateInputs inputs;
    inputs.bos_token = bos_token;
    inputs.eos_token = eos_token;
    for (size_t i = 0; i < messages.size(); ++i) {
      const json& m = messages[i];
      const std::string at = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) throw ApiError{400, "`" + at + "` must be an object", at};
      if (!m.contains("role") || !m["role"].is_string()) {
        throw ApiError{400, "`" + at + ".role` must be a string", at + ".role"};
      }
      const std::string role = m["role"].get<std::string>();
      static const char* kRoles[] = {"system", "user", "assistant", "tool", "developer"};
      if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles)) {
        throw ApiError{400,
                       "`" + at + ".role` is `" + role +
                           "`; expected system, user, assistant, tool or developer",
                       at + ".role"};
      }
      if (!m.contains("content") || m["content"].is_null()) {
        throw ApiError{400, "`" + at + ".content` is required", at + ".content"};
      }
      std::string content;
      const json& c = m["content"];
      if (c.is_string()) {
        content = c.get<std::string>();
      } else if (c.is_array()) {  // content parts: text only
        for (const json& part : c) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
              !part["text"].is_string()) {
            throw ApiError{400,
                           "`" + at + ".content` parts must be {\"type\": \"text\", \"text\": ...}",
                           at + ".content"};
          }
          content += part["text"].get<std::string>();
        }
      } else {
        throw ApiError{400, "`" + at + ".content` must be a string or an array of text parts",
                       at + ".content"};
      }
      if (tokenizer::to_valid_utf8(content) != content) {
        throw ApiError{400, "`" + at + ".content` is not valid UTF-8", at + ".content"};
      }
      inputs.messages.push_back({role, content});
    }
    if (body.contains("add_generation_prompt") && !body["add_generation_prompt"].is_null()) {
      if (!body["add_generation_prompt"].is_boolean()) {
        throw ApiError{400, "`add_generation_prompt` must be a boolean", "add_generation_prompt"};
      }
      inputs.add_generation_prompt = body["add_generation_prompt"].get<bool>();
    }
    try {
      return chat->render(inputs);
    } catch (const Error& e) {  // raise_exception(...) or an error while rendering
      throw ApiError{400, e.what(), "messages"};
    }
  }

  static json parse_body(const std::string& text) {
    json body;
    try {
      body = json::parse(text);
    } catch (const json::exception& e) {
      throw ApiError{400, std::string("the body is not valid JSON: ") + e.what(), ""};
    }
    if (!body.is_object()) throw ApiError{400, "the body must be a JSON object", ""};
    return body;
  }

  // Parses and checks a request body (of /v1/completions, or with `chat` of
  // /v1/chat/completions); the request's token ids and sampling.
  JobPtr parse(const std::string& text, bool chat_request) {
    const json body = parse_body(text);
    if (body.contains("model") && !body["model"].is_null()) {
      if (!body["model"].is_string()) throw ApiError{400, "`model` must be a string", "model"};
      if (body["model"].get<std::string>() != model_name) {
        throw ApiError{404,
                       "the model `" + body["model"].get<std::string>() +
                           "` does not exist; this server serves `" + model_name + "`",
                       "model", "invalid_request_error", "model_not_found"};
      }
    }
    auto job = std::make_shared<Job>();
    job->chat = chat_request;
    const json& prompt = chat_request ? json(nullptr) : body.value("prompt", json(nullptr));
    if (chat_request) {
      for (const auto id : tok->encode(render_chat(body), /*add_special_tokens=*/false)) {
        job->prompt.push_back(id);
      }
    } else if (!body.contains("prompt")) {
      throw ApiError{400, "`prompt` is required", "prompt"};
    } else if (prompt.is_string()) {
      if (!tok) {
        throw ApiError{400, "this server has no tokenizer: give `prompt` as an array of token ids",
                       "prompt"};
      }
      const std::string s = prompt.get<std::string>();
      if (tokenizer::to_valid_utf8(s) != s) {
        throw ApiError{400, "`prompt` is not valid UTF-8", "prompt"};
      }
      for (const auto id : tok->encode(s)) job->prompt.push_back(id);
    } else if (prompt.is_array()) {
      for (const auto& t : prompt) {
        if (!t.is_number_integer()) {
          throw ApiError{400, "`prompt` must be a string or an array of token ids", "prompt"};
        }
        job->prompt.push_back(t.get<int64_t>());
      }
    } else {
      throw ApiError{400, "`prompt` must be a string or an array of token ids", "prompt"};
    }
    const char* prompt_field = chat_request ? "messages" : "prompt";
    if (job->prompt.empty()) {
      throw ApiError{400, chat_request ? "the rendered conversation is empty" : "`prompt` is empty",
                     prompt_field};
    }
    inference::SamplingParams& p = job->sampling;
    p = settings.sampling();
    p.max_tokens = integer(body, "max_tokens", p.max_tokens);
    p.temperature = number(body, "temperature", p.temperature);
    p.top_p = number(body, "top_p", p.top_p);
    p.top_k = integer(body, "top_k", p.top_k);
    p.min_p = number(body, "min_p", p.min_p);
    p.presence_penalty = number(body, "presence_penalty", p.presence_penalty);
    p.repetition_penalty = number(body, "repetition_penalty", p.repetition_penalty);
    p.seed = static_cast<uint64_t>(integer(body, "seed", static_cast<int64_t>(p.seed)));
    if (!chat_request && body.contains("logprobs") && !body["logprobs"].is_null()) {
      if (!body["logprobs"].is_number_integer() || body["logprobs"].get<int64_t>() < 0 ||
          body["logprobs"].get<int64_t>() > 20) {
        throw ApiError{400, "`logprobs` must be an integer in [0, 20]", "logprobs"};
      }
      p.logprobs = body["logprobs"].get<int64_t>();
    }
    if (chat_request) {
      bool want = false;
      if (body.contains("logprobs") && !body["logprobs"].is_null()) {
        if (!body["logprobs"].is_boolean()) {
          throw ApiError{400, "`logprobs` must be a boolean", "logprobs"};
        }
        want = body["logprobs"].get<bool>();
      }
      int64_t top = 0;
      if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
        if (!body["top_logprobs"].is_number_integer() || body["top_logprobs"].get<int64_t>() < 0 ||
            body["top_logprobs"].get<int64_t>() > 20) {
          throw ApiError{400, "`top_logprobs` must be an integer in [0, 20]", "top_logprobs"};
        }
        if (!want) {
          throw ApiError{400, "`top_logprobs` needs `logprobs`: true", "top_logprobs"};
        }
        top = body["top_logprobs"].get<int64_t>();
      }
      p.logprobs = want ? top : -1;
    }
    const int64_t context = engine.model().seq_len;
    if (static_cast<int64_t>(job->prompt.size()) >= context) {
      throw ApiError{400,
                     "the prompt has " + std::to_string(job->prompt.size()) +
                         " tokens; the model's context is " + std::to_string(context),
                     prompt_field};
    }
    const bool max_tokens_given = body.contains("max_tokens") && !body["max_tokens"].is_null();
    if (!max_tokens_given) {
      // Unset: [inference]'s max_tokens, as far as the context leaves room.
      p.max_tokens = std::min(p.max_tokens, context - static_cast<int64_t>(job->prompt.size()));
    }
    if (p.max_tokens > context - static_cast<int64_t>(job->prompt.size())) {
      throw ApiError{400,
                     "`max_tokens` = " + std::to_string(p.max_tokens) +
                         " runs past the context: " + std::to_string(job->prompt.size()) +
                         " prompt tokens + max_tokens > " + std::to_string(context),
                     "max_tokens"};
    }
    try {
      inference::check_sampling(p);
    } catch (const Error& e) {
      const std::string what = e.what();
      throw ApiError{400, what, what.substr(0, what.find(':'))};
    }
    if (body.contains("stop") && !body["stop"].is_null()) {
      const json& stop = body["stop"];
      if (stop.is_string()) {
        job->stop.push_back(stop.get<std::string>());
      } else if (stop.is_array()) {
        for (const auto& s : stop) {
          if (!s.is_string()) throw ApiError{400, "`stop` must be strings", "stop"};
          job->stop.push_back(s.get<std::string>());
        }
      } else {
        throw ApiError{400, "`stop` must be a string or an array of strings", "stop"};
      }
      for (const auto& s : job->stop) {
        if (s.empty()) throw ApiError{400, "`stop` holds an empty string", "stop"};
      }
      if (!job->stop.empty() && !tok) {
        throw ApiError{400, "stop strings need a tokenizer, which this server has not", "stop"};
      }
    }
    if (body.contains("stream") && !body["stream"].is_null()) {
      if (!body["stream"].is_boolean()) throw ApiError{400, "`stream` must be a boolean", "stream"};
      job->stream = body["stream"].get<bool>();
    }
    if (tok && !settings.ignore_eos && tok->eos_id()) p.stop_token_ids.push_back(*tok->eos_id());
    if (chat_request && !settings.ignore_eos) {
      p.stop_token_ids.insert(p.stop_token_ids.end(), turn_end_ids.begin(), turn_end_ids.end());
    }
    return job;
  }

  // Handler thread: queue the job, wait until the loop admitted or refused it.
  void submit(const JobPtr& job) {
    {
      std::lock_guard<std::mutex> lock(inbox_mutex);
      if (g_stop.load()) throw ApiError{503, "the server is stopping", "", "server_error"};
      if (queued.load() + scheduled.load() >= max_queue) {
        throw ApiError{429, "too many requests queued (" + std::to_string(max_queue) + ")", "",
                       "rate_limit_error"};
      }
      ++queued;
      inbox.push_back(job);
    }
    inbox_changed.notify_one();
    std::unique_lock<std::mutex> lock(job->mutex);
    job->changed.wait(lock, [&] { return job->admitted; });
    if (job->rejected.status != 0) throw job->rejected;
  }

  // The engine loop (main thread). Returns when stopped and drained.
  void loop() {
    inference::Scheduler& scheduler = engine.scheduler();
    std::map<int64_t, JobPtr> live;
    metrics.blocks_total = scheduler.allocator().num_blocks();
    auto last_step = std::chrono::steady_clock::now();
    while (true) {
      std::deque<JobPtr> arrived;
      {
        std::unique_lock<std::mutex> lock(inbox_mutex);
        if (inbox.empty() && !scheduler.has_work()) {
          if (g_stop.load()) break;
          inbox_changed.wait_for(lock, std::chrono::milliseconds(100));
        }
        arrived.swap(inbox);
      }
      for (const JobPtr& job : arrived) {
        int64_t id = -1;
        ApiError refused;
        refused.status = 0;
        try {
          id = scheduler.add_request(inference::Request{job->prompt, job->sampling});
        } catch (const Error& e) {
          const std::string what = e.what();
          refused = ApiError{400, what, what.substr(0, what.find(':'))};
        }
        scheduled = scheduler.num_waiting();  // before it leaves the inbox's count
        --queued;
        {
          std::lock_guard<std::mutex> lock(job->mutex);
          job->admitted = true;
          job->rejected = refused;
        }
        job->changed.notify_all();
        if (refused.status == 0) {
          live[id] = job;
          ++metrics.requests;
          job->arrived = std::chrono::steady_clock::now();
          metrics.prompt_tokens += static_cast<int64_t>(job->prompt.size());
        } else {
          ++metrics.rejected;
        }
      }
      // Clients that went away.
      for (auto it = live.begin(); it != live.end();) {
        if (it->second->cancel.load()) {
          scheduler.cancel(it->first);
          finish(*it->second, "cancelled");
          scheduler.forget(it->first);
          it = live.erase(it);
        } else {
          ++it;
        }
      }
      if (scheduler.has_work()) {
        for (const inference::TokenEvent& e : engine.step()) deliver(scheduler, live, e);
        last_step = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - last_step > std::chrono::milliseconds(500)) {
        engine.idle();
        last_step = std::chrono::steady_clock::now();
      }
      metrics.running = scheduler.num_running();
      scheduled = scheduler.num_waiting();
      metrics.waiting = scheduler.num_waiting() + queued.load();
      metrics.blocks_used = scheduler.allocator().num_used();
      metrics.preemptions = scheduler.preemptions();
    }
  }

  void finish(Job& job, const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(job.mutex);
      job.done = true;
      job.finish_reason = reason;
    }
    job.changed.notify_all();
  }

  void deliver(inference::Scheduler& scheduler, std::map<int64_t, JobPtr>& live,
               const inference::TokenEvent& e) {
    auto it = live.find(e.request);
    if (it == live.end()) return;
    Job& job = *it->second;
    ++metrics.generated_tokens;
    const auto now = std::chrono::steady_clock::now();
    const bool first = scheduler.generated(e.request).size() == 1;
    (first ? metrics.ttft : metrics.inter_token)
        .observe(
            std::chrono::duration<double>(now - (first ? job.arrived : job.last_token)).count());
    job.last_token = now;
    std::string reason = e.finish_reason;
    bool finished = e.finished;
    {
      std::lock_guard<std::mutex> lock(job.mutex);
      job.tokens = scheduler.generated(e.request);
      job.logprobs = scheduler.logprobs(e.request);
      if (tok) {
        std::vector<tokenizer::TokenId> ids(job.tokens.begin(), job.tokens.end());
        job.text = tok->decode(ids);
        size_t cut = std::string::npos;
        for (const auto& s : job.stop) cut = std::min(cut, job.text.find(s));
        if (cut != std::string::npos) {
          job.text.resize(cut);
          if (!finished) scheduler.cancel(e.request);
          finished = true;
          reason = "stop";
        }
      }
    }
    job.changed.notify_all();
    if (finished) {
      finish(job, reason);
      scheduler.forget(e.request);
      live.erase(it);
    }
  }

  std::string metrics_text() const {
    std::ostringstream out;
    auto gauge = [&](const char* name, const char* help, const char* type, int64_t v) {
      out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
          << name << " " << v << "\n";
    };
    gauge("kolos_requests_total", "Requests admitted.", "counter", metrics.requests);
    gauge("kolos_requests_rejected_total", "Requests refused after parsing.", "counter",
          metrics.rejected);
    gauge("kolos_prompt_tokens_total", "Prompt tokens of admitted requests.", "counter",
          metrics.prompt_tokens);
    gauge("kolos_generation_tokens_total", "Tokens generated.", "counter",
          metrics.generated_tokens);
    gauge("kolos_requests_running", "Sequences with blocks in the KV cache.", "gauge",
          metrics.running);
    gauge("kolos_requests_waiting", "Requests queued or preempted.", "gauge", metrics.waiting);
    gauge("kolos_kv_blocks_in_use", "KV cache blocks in use.", "gauge", metrics.blocks_used);
    gauge("kolos_kv_blocks_total", "KV cache blocks in the pool.", "gauge", metrics.blocks_total);
    gauge("kolos_preemptions_total", "Sequences preempted (recomputed later).", "counter",
          metrics.preemptions);
    metrics.ttft.write(out, "kolos_time_to_first_token_seconds",
                       "From admission to a request's first token.");
    metrics.inter_token.write(out, "kolos_inter_token_latency_seconds",
                              "Between consecutive tokens of a request.");
    return out.str();
  }
};

json completion_chunk(const std::string& id, const std::string& model, const std::string& text,
                      const std::vector<int64_t>& tokens, const std::string& reason,
                      const json& logprobs = nullptr) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", static_cast<int64_t>(std::time(nullptr))},
          {"model", model},
          {"choices",
           {{{"index", 0},
             {"text", text},
             {"token_ids", tokens},
             {"logprobs", logprobs},
             {"finish_reason", reason.empty() ? json(nullptr) : json(reason)}}}}};
}

json chat_chunk(const std::string& id, const std::string& model, const json& delta,
                const std::vector<int64_t>& tokens, const json& logprobs,
                const std::string& reason) {
  return {{"id", id},
          {"object", "chat.completion.chunk"},
          {"created", static_cast<int64_t>(std::time(nullptr))},
          {"model", model},
          {"choices",
           {{{"index", 0},
             {"delta", delta},
             {"token_ids", tokens},
             {"logprobs", logprobs},
             {"finish_reason", reason.empty() ? json(nullptr) : json(reason)}}}}};
}

json chat_response(const std::string& id, const std::string& model, const std::string& text,
                   const std::vector<int64_t>& tokens, const json& logprobs,
                   const std::string& reason) {
  return {{"id", id},
          {"object", "chat.completion"},
          {"created", static_cast<int64_t>(std::time(nullptr))},
          {"model", model},
          {"choices",
           {{{"index", 0},
             {"message", {{"role", "assistant"}, {"content", text}}},
             {"token_ids", tokens},
             {"logprobs", logprobs},
             {"finish_reason", reason.empty() ? json(nullptr) : json(reason)}}}}};
}

json usage_of(const Job& job) {
  const auto prompt = static_cast<int64_t>(job.prompt.size());
  const auto completion = static_cast<int64_t>(job.tokens.size());
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

// A token as logprobs show it: its own decoding, special tokens included
// (a byte-level token that ends inside a character shows U+FFFD).
std::string piece_of(const tokenizer::Tokenizer* tok, int64_t id) {
  if (!tok) return "token_id:" + std::to_string(id);
  return tok->decode({static_cast<tokenizer::TokenId>(id)}, /*skip_special_tokens=*/false);
}

// OpenAI's legacy completions shape; `offset` (bytes of the pieces before
// these tokens) advances.
json legacy_logprobs(const tokenizer::Tokenizer* tok,
                     const std::vector<inference::TokenLogprob>& lps, size_t& offset) {
  json tokens = json::array(), values = json::array(), tops = json::array(),
       offsets = json::array();
  for (const auto& lp : lps) {
    const std::string piece = piece_of(tok, lp.token);
    tokens.push_back(piece);
    values.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [t, v] : lp.top) {
      const std::string key = piece_of(tok, t);
      if (!top.contains(key)) top[key] = v;
    }
    tops.push_back(top);
    offsets.push_back(offset);
    offset += piece.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", values},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

// OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs}]}.
json chat_logprobs(const tokenizer::Tokenizer* tok,
                   const std::vector<inference::TokenLogprob>& lps) {
  auto entry = [&](int64_t t, double v) {
    const std::string piece = piece_of(tok, t);
    std::vector<int> bytes(piece.begin(), piece.end());
    for (int& b : bytes) b &= 0xFF;
    return json{{"token", piece}, {"logprob", v}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const auto& lp : lps) {
    json e = entry(lp.token, lp.logprob);
    e["top_logprobs"] = json::array();
    for (const auto& [t, v] : lp.top) e["top_logprobs"].push_back(entry(t, v));
    content.push_back(e);
  }
  return {{"content", content}};
}

// The chat template: inference.chat_template (refused at start when it is
// missing, unreadable or outside the supported subset), else the tokenizer's
// own (when outside the subset, chat requests are answered 400 with the
// reason and the rest of the server serves). Then the special tokens the
// template ends an assistant turn with, found by rendering a probe
// conversation: chat requests stop at them.
void load_chat_template(Server& server, const inference::InferenceConfig& settings) {
  std::optional<tokenizer::ChatTemplateSource> found;
  if (server.tok) found = tokenizer::find_chat_template(server.tok->path());
  if (server.tok) {
    auto token = [&](std::optional<tokenizer::TokenId> id) {
      return id ? server.tok->id_to_token(*id).value_or("") : std::string();
    };
    server.bos_token =
        found && !found->bos_token.empty() ? found->bos_token : token(server.tok->bos_id());
    server.eos_token =
        found && !found->eos_token.empty() ? found->eos_token : token(server.tok->eos_id());
  }
  if (!settings.chat_template.empty()) {
    if (!server.tok) {
      throw ConfigError(
          "inference.chat_template: a chat template needs a tokenizer "
          "(--tokenizer PATH or inference.tokenizer)");
    }
    const std::string& path = settings.chat_template;
    server.chat.emplace(tokenizer::read_chat_template_file(path), path);
  } else if (!server.tok) {
    server.chat_missing =
        "this server has no chat template: it has no tokenizer (--tokenizer PATH) to find one "
        "with, and inference.chat_template is not set";
    return;
  } else if (!found) {
    server.chat_missing =
        "this server has no chat template: no tokenizer_config.json with a "
        "\"chat_template\" (or chat_template.jinja) next to " +
        server.tok->path() + "; give one with --chat-template PATH";
    return;
  } else {
    try {
      server.chat.emplace(found->source, found->origin);
    } catch (const Error& e) {
      server.chat_missing = std::string("this server's chat template is not supported: ") +
                            e.what() + "; give another with --chat-template PATH";
      std::fprintf(stderr, "kolos: warning: /v1/chat/completions is off: %s\n",
                   server.chat_missing.c_str());
      return;
    }
  }
  // The text after an assistant message's content, up to the next turn.
  const std::string marker = "kolos-turn-probe";
  tokenizer::ChatTemplateInputs probe;
  probe.messages = {{"user", "hi"}, {"assistant", marker}};
  probe.bos_token = server.bos_token;
  probe.eos_token = server.eos_token;
  probe.add_generation_prompt = false;
  try {
    const std::string text = server.chat->render(probe);
    const size_t at = text.rfind(marker);
    if (at == std::string::npos) return;
    const auto ids = server.tok->encode(text.substr(at + marker.size()), false);
    // The first token after the content, when it is a special token.
    if (!ids.empty() && server.tok->decode({ids[0]}, true).empty()) {
      server.turn_end_ids.push_back(ids[0]);
    }
  } catch (const Error&) {
    // A template that refuses the probe conversation: no turn-end ids beyond eos.
  }
}

}  // namespace

int serve_command(const std::vector<std::string>& args, int argc, char** argv) {
  std::string checkpoint, config_path, host = "127.0.0.1", model_name, tokenizer_path,
                                       chat_template_path;
  std::string mpirun = KOLOS_MPIEXEC;
  int port = 8000, ranks = 0;
  int64_t max_queue = 256;
  std::vector<std::string> overrides, forwarded;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UsageError("kolos serve: " + a + " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kServeUsage;
      return 0;
    } else if (a == "--host") {
      host = value();
      forwarded.insert(forwarded.end(), {"--host", host});
    } else if (a == "--port") {
      const std::string v = value();
      port = std::atoi(v.c_str());
      if (port < 0 || port > 65535 || (port == 0 && v != "0")) {
        throw UsageError("kolos serve: --port `" + v + "`: expected 0..65535");
      }
      forwarded.insert(forwarded.end(), {"--port", v});
    } else if (a == "--model") {
      model_name = value();
      forwarded.insert(forwarded.end(), {"--model", model_name});
    } else if (a == "--max-queue") {
      const std::string v = value();
      max_queue = std::atoll(v.c_str());
      if (max_queue < 1) throw UsageError("kolos serve: --max-queue `" + v + "`: expected >= 1");
      forwarded.insert(forwarded.end(), {"--max-queue", v});
    } else if (a == "--tokenizer") {
      tokenizer_path = value();
      forwarded.insert(forwarded.end(), {"--tokenizer", tokenizer_path});
    } else if (a == "--chat-template") {
      chat_template_path = value();
      forwarded.insert(forwarded.end(), {"--chat-template", chat_template_path});
    } else if (a == "--set") {
      overrides.push_back(value());
    } else if (a == "-n" || a == "--np") {
      ranks = std::atoi(value().c_str());
      if (ranks < 1) throw UsageError("kolos serve: -n expects a number of ranks >= 1");
    } else if (a == "--mpirun") {
      mpirun = value();
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError("kolos serve: unknown option `" + a + "` (see `kolos serve --help`)");
    } else if (checkpoint.empty()) {
      checkpoint = a;
    } else if (config_path.empty()) {
      config_path = a;
      forwarded.push_back(a);
    } else {
      throw UsageError("kolos serve: unexpected argument `" + a + "`");
    }
  }
  if (checkpoint.empty()) throw UsageError("kolos serve: missing CKPT (see `kolos serve --help`)");
  if (model_name.empty()) {
    std::string trimmed = checkpoint;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    model_name = trimmed.substr(trimmed.find_last_of('/') + 1);
  }
  std::vector<std::string> all_overrides;
  if (!tokenizer_path.empty())
    all_overrides.push_back("inference.tokenizer=" + quote_toml(tokenizer_path));
  if (!chat_template_path.empty())
    all_overrides.push_back("inference.chat_template=" + quote_toml(chat_template_path));
  all_overrides.insert(all_overrides.end(), overrides.begin(), overrides.end());
  if (ranks > 1) {
    inference::read_inference_config(
        inference_cli::command_config(config_path, all_overrides, "kolos serve"));
    LaunchOptions launch;
    launch.ranks = ranks;
    launch.config = checkpoint;
    launch.command = "serve";
    launch.extra = forwarded;
    launch.overrides = overrides;
    launch.mpirun = mpirun;
    return exec_mpirun(launch);
  }

  std::signal(SIGTERM, on_serve_stop_signal);
  std::signal(SIGINT, on_serve_stop_signal);
  Runtime runtime(&argc, &argv);
  return run_guarded(runtime, [&] {
    RunConfig config;
    inference::InferenceConfig settings;
    agreed(*runtime.world(), [&] {
      config = inference_cli::command_config(config_path, all_overrides, "kolos serve");
      settings = inference::read_inference_config(config);
    });
    inference::InferenceEngine engine(checkpoint, settings, runtime.world(), config.plugins.path);
    Server server{engine, settings, nullptr, model_name, max_queue};
    httplib::Server http;
    // A request holds its handler thread until it ends, so the pool has one
    // for every request the engine may run (max_seqs) or queue
    // (--max-queue), one more to answer the next with 429, and a few for
    // /health and /metrics. cpp-httplib's default, max(8, cores - 1),
    // would leave the ninth concurrent request unread in the listen backlog.
    const auto handlers = static_cast<size_t>(settings.max_seqs + max_queue + 4);
    http.new_task_queue = [handlers] { return new httplib::ThreadPool(handlers); };
    int bound = -1;
    agreed(*runtime.world(), [&] {
      if (!engine.is_driver()) return;
      server.tok = inference_cli::open_tokenizer(settings, checkpoint);
      load_chat_template(server, settings);
      bound = port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
      if (bound < 0) {
        throw UsageError("kolos serve: cannot listen on " + host + ":" + std::to_string(port));
      }
    });
    if (!engine.is_driver()) {
      engine.follow();
      return 0;
    }

    auto reply_error = [](httplib::Response& res, const ApiError& e) {
      res.status = e.status;
      res.set_content(error_body(e), "application/json");
    };
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(server.metrics_text(), "text/plain; version=0.0.4");
    });
    http.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
      const json body = {{"object", "list"},
                         {"data",
                          {{{"id", model_name},
                            {"object", "model"},
                            {"owned_by", "kolos"},
                            {"max_model_len", engine.model().seq_len}}}}};
      res.set_content(body.dump(), "application/json");
    });
    // Text <-> ids with the server's tokenizer (immutable: safe from any thread).
    auto parse_object = [](const std::string& text) {
      json body;
      try {
        body = json::parse(text);
      } catch (const json::exception& e) {
        throw ApiError{400, std::string("the body is not valid JSON: ") + e.what(), ""};
      }
      if (!body.is_object()) throw ApiError{400, "the body must be a JSON object", ""};
      return body;
    };
    http.Post("/tokenize", [&](const httplib::Request& req, httplib::Response& res) {
      try {
        const json body = parse_object(req.body);
        if (!server.tok) throw ApiError{400, "this server has no tokenizer", "prompt"};
        if (!body.contains("prompt") || !body["prompt"].is_string()) {
          throw ApiError{400, "`prompt` must be a string", "prompt"};
        }
        std::vector<int64_t> ids;
        for (const auto id : server.tok->encode(body["prompt"].get<std::string>()))
          ids.push_back(id);
        res.set_content(json{{"tokens", ids}, {"count", ids.size()}}.dump(), "application/json");
      } catch (const ApiError& e) {
        reply_error(res, e);
      }
    });
    http.Post("/detokenize", [&](const httplib::Request& req, httplib::Response& res) {
      try {
        const json body = parse_object(req.body);
        if (!server.tok) throw ApiError{400, "this server has no tokenizer", "tokens"};
        if (!body.contains("tokens") || !body["tokens"].is_array()) {
          throw ApiError{400, "`tokens` must be an array of token ids", "tokens"};
        }
        std::vector<tokenizer::TokenId> ids;
        for (const auto& t : body["tokens"]) {
          if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
              t.get<int64_t>() >= server.tok->vocab_size()) {
            throw ApiError{
                400,
                "`tokens` must hold ids in [0, " + std::to_string(server.tok->vocab_size()) + ")",
                "tokens"};
          }
          ids.push_back(static_cast<tokenizer::TokenId>(t.get<int64_t>()));
        }
        res.set_content(json{{"prompt", server.tok->decode(ids)}}.dump(), "application/json");
      } catch (const ApiError& e) {
        reply_error(res, e);
      }
    });
    std::atomic<int64_t> next_id{0};
    // /v1/completions and /v1/chat/completions: one request, answered whole
    // or as server-sent events.
    auto generation = [&](const httplib::Request& req, httplib::Response& res, bool chat) {
      JobPtr job;
      try {
        job = server.parse(req.body, chat);
        server.submit(job);
      } catch (const ApiError& e) {
        reply_error(res, e);
        return;
      }
      const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
      const tokenizer::Tokenizer* tok = server.tok.get();
      if (!job->stream) {
        std::unique_lock<std::mutex> lock(job->mutex);
        job->changed.wait(lock, [&] { return job->done; });
        json logprobs = nullptr;
        if (job->sampling.logprobs >= 0) {
          size_t offset = 0;
          logprobs = chat ? chat_logprobs(tok, job->logprobs)
                          : legacy_logprobs(tok, job->logprobs, offset);
        }
        json body = chat ? chat_response(id, model_name, job->text, job->tokens, logprobs,
                                         job->finish_reason)
                         : completion_chunk(id, model_name, job->text, job->tokens,
                                            job->finish_reason, logprobs);
        body["usage"] = usage_of(*job);
        res.set_content(body.dump(), "application/json");
        return;
      }
      // Server-sent events: one event per new piece of text (or token); a
      // chat stream opens with the assistant's role.
      struct Sent {
        size_t text = 0, tokens = 0, offset = 0;
        bool opened = false;
      };
      auto sent = std::make_shared<Sent>();
      res.set_chunked_content_provider(
          "text/event-stream",
          [job, id, sent, chat, tok, &model_name](size_t, httplib::DataSink& sink) {
            auto send = [&](const json& chunk) {
              const std::string event = "data: " + chunk.dump() + "\n\n";
              if (sink.write(event.data(), event.size())) return true;
              job->cancel.store(true);
              return false;
            };
            if (chat && !sent->opened) {
              sent->opened = true;
              if (!send(chat_chunk(id, model_name, {{"role", "assistant"}, {"content", ""}}, {},
                                   nullptr, ""))) {
                return false;
              }
            }
            std::unique_lock<std::mutex> lock(job->mutex);
            job->changed.wait_for(lock, std::chrono::milliseconds(200),
                                  [&] { return job->done || job->tokens.size() > sent->tokens; });
            size_t hold = 0;
            for (const auto& s : job->stop) hold = std::max(hold, s.size() - 1);
            const size_t end =
                job->done ? job->text.size() : inference_cli::stable_prefix(job->text, hold);
            std::vector<int64_t> new_tokens(job->tokens.begin() + static_cast<long>(sent->tokens),
                                            job->tokens.end());
            const std::string piece =
                end > sent->text ? job->text.substr(sent->text, end - sent->text) : "";
            if (!new_tokens.empty() || !piece.empty() || job->done) {
              json logprobs = nullptr;
              if (job->sampling.logprobs >= 0) {
                const size_t from = std::min(sent->tokens, job->logprobs.size());
                const std::vector<inference::TokenLogprob> fresh(
                    job->logprobs.begin() + static_cast<long>(from), job->logprobs.end());
                logprobs =
                    chat ? chat_logprobs(tok, fresh) : legacy_logprobs(tok, fresh, sent->offset);
              }
              const std::string reason = job->done ? job->finish_reason : "";
              json chunk =
                  chat ? chat_chunk(id, model_name,
                                    piece.empty() ? json::object() : json{{"content", piece}},
                                    new_tokens, logprobs, reason)
                       : completion_chunk(id, model_name, piece, new_tokens, reason, logprobs);
              if (job->done) chunk["usage"] = usage_of(*job);
              sent->text = std::max(sent->text, end);
              sent->tokens = job->tokens.size();
              if (!send(chunk)) return false;
            }
            if (job->done) {
              static const std::string kDone = "data: [DONE]\n\n";
              sink.write(kDone.data(), kDone.size());
              sink.done();
            }
            return true;
          },
          [job](bool success) {
            if (!success) job->cancel.store(true);  // the client went away
          });
    };
    http.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
      generation(req, res, false);
    });
    http.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
      generation(req, res, true);
    });
    // Not OpenAI's: the prompt a chat request would be given, as text and ids.
    http.Post("/v1/chat/render", [&](const httplib::Request& req, httplib::Response& res) {
      try {
        const std::string text = server.render_chat(Server::parse_body(req.body));
        std::vector<int64_t> ids;
        for (const auto t : server.tok->encode(text, false)) ids.push_back(t);
        res.set_content(json{{"prompt", text}, {"tokens", ids}}.dump(), "application/json");
      } catch (const ApiError& e) {
        reply_error(res, e);
      }
    });
    http.set_error_handler([&](const httplib::Request&, httplib::Response& res) {
      if (res.body.empty()) {
        reply_error(res, ApiError{res.status, "no route " + std::to_string(res.status), "",
                                  "invalid_request_error"});
      }
    });
    if (server.chat) {
      std::string ends;
      for (const int64_t t : server.turn_end_ids) {
        ends += " " + server.tok->id_to_token(static_cast<tokenizer::TokenId>(t)).value_or("?");
      }
      std::fprintf(stderr, "kolos: chat template %s; a turn ends at eos%s\n",
                   server.chat->origin().c_str(), ends.c_str());
    }
    std::fprintf(stderr, "kolos: %s\nkolos: serving on http://%s:%d (model `%s`)\n",
                 engine.describe().c_str(), host.c_str(), bound, model_name.c_str());
    std::thread listener([&] { http.listen_after_bind(); });
    std::thread watcher([&] {
      while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      http.stop();  // no new connections; the loop finishes what is in flight
      server.inbox_changed.notify_all();
    });
    server.loop();
    watcher.join();
    listener.join();
    engine.stop();
    std::fprintf(stderr, "kolos: served %lld requests (%lld tokens); stopped\n",
                 static_cast<long long>(server.metrics.requests.load()),
                 static_cast<long long>(server.metrics.generated_tokens.load()));
    return 0;
  });
}

}  // namespace kolos::cli
#endif  // KOLOS_WITH_HTTPLIB
