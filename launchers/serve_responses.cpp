// The JSON bodies `kolos serve` answers with, in OpenAI's shapes (plus each
// choice's `token_ids`): errors, completions, chat completions and their
// streamed chunks, usage, and logprobs with each token's own decoding.
#include "serve_responses.h"

#include <ctime>

namespace kolos::cli::serve {
namespace {

// A token as logprobs show it: its own decoding, special tokens included
// (a byte-level token that ends inside a character shows U+FFFD).
std::string piece_of(const tokenizer::Tokenizer* tok, int64_t id) {
  if (!tok) return "token_id:" + std::to_string(id);
  return tok->decode({static_cast<tokenizer::TokenId>(id)}, /*skip_special_tokens=*/false);
}

}  // namespace

std::string error_body(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return j.dump();
}

json completion_chunk(const std::string& id, const std::string& model, const std::string& text,
                      const std::vector<int64_t>& tokens, const std::string& reason,
                      const json& logprobs) {
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

}  // namespace kolos::cli::serve
