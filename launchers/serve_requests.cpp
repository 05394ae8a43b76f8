// `kolos serve`: a request body of /v1/completions or /v1/chat/completions
// parsed and checked into a Job (its prompt's token ids, its sampling, stop
// strings and streaming), every refusal an ApiError naming the field.
#include <algorithm>
#include <cmath>
#include <string>

#include "kolos/core/error.h"
#include "kolos/inference/sampler.h"
#include "serve_server.h"

namespace kolos::cli::serve {
namespace {

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

}  // namespace

json Server::parse_body(const std::string& text) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {
    throw ApiError{400, std::string("the body is not valid JSON: ") + e.what(), ""};
  }
  if (!body.is_object()) throw ApiError{400, "the body must be a JSON object", ""};
  return body;
}

JobPtr Server::parse(const std::string& text, bool chat_request) {
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

}  // namespace kolos::cli::serve
