// `kolos serve`'s HTTP routes: POST /v1/completions and
// /v1/chat/completions (answered whole or as server-sent events, which stop
// the request when the client goes away), POST /v1/chat/render, GET
// /v1/models, POST /tokenize and /detokenize, GET /health and /metrics, and
// errors (unknown routes included) as OpenAI-style JSON. cpp-httplib's
// handler threads run them.
#include "serve_routes.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "generate_command.h"
#include "serve_responses.h"

namespace kolos::cli::serve {
namespace {

void reply_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
}

// /v1/completions and /v1/chat/completions: one request, answered whole
// or as server-sent events.
void generation(Server& server, const httplib::Request& req, httplib::Response& res, bool chat) {
  const std::string& model_name = server.model_name;
  JobPtr job;
  try {
    job = server.parse(req.body, chat);
    server.submit(job);
  } catch (const ApiError& e) {
    reply_error(res, e);
    return;
  }
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(server.next_id++);
  const tokenizer::Tokenizer* tok = server.tok.get();
  if (!job->stream) {
    std::unique_lock<std::mutex> lock(job->mutex);
    job->changed.wait(lock, [&] { return job->done; });
    json logprobs = nullptr;
    if (job->sampling.logprobs >= 0) {
      size_t offset = 0;
      logprobs =
          chat ? chat_logprobs(tok, job->logprobs) : legacy_logprobs(tok, job->logprobs, offset);
    }
    json body =
        chat ? chat_response(id, model_name, job->text, job->tokens, logprobs, job->finish_reason)
             : completion_chunk(id, model_name, job->text, job->tokens, job->finish_reason,
                                logprobs);
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
            logprobs = chat ? chat_logprobs(tok, fresh) : legacy_logprobs(tok, fresh, sent->offset);
          }
          const std::string reason = job->done ? job->finish_reason : "";
          json chunk = chat ? chat_chunk(id, model_name,
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
}

}  // namespace

void add_routes(httplib::Server& http, Server& server) {
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(server.metrics_text(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    const json body = {{"object", "list"},
                       {"data",
                        {{{"id", server.model_name},
                          {"object", "model"},
                          {"owned_by", "kolos"},
                          {"max_model_len", server.engine.model().seq_len}}}}};
    res.set_content(body.dump(), "application/json");
  });
  // Text <-> ids with the server's tokenizer (immutable: safe from any thread).
  http.Post("/tokenize", [&](const httplib::Request& req, httplib::Response& res) {
    try {
      const json body = Server::parse_body(req.body);
      if (!server.tok) throw ApiError{400, "this server has no tokenizer", "prompt"};
      if (!body.contains("prompt") || !body["prompt"].is_string()) {
        throw ApiError{400, "`prompt` must be a string", "prompt"};
      }
      std::vector<int64_t> ids;
      for (const auto id : server.tok->encode(body["prompt"].get<std::string>())) ids.push_back(id);
      res.set_content(json{{"tokens", ids}, {"count", ids.size()}}.dump(), "application/json");
    } catch (const ApiError& e) {
      reply_error(res, e);
    }
  });
  http.Post("/detokenize", [&](const httplib::Request& req, httplib::Response& res) {
    try {
      const json body = Server::parse_body(req.body);
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
  http.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    generation(server, req, res, false);
  });
  http.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    generation(server, req, res, true);
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
}

}  // namespace kolos::cli::serve
