// The JSON bodies `kolos serve` answers with (launchers/serve_responses.cpp):
// errors in OpenAI's shape, completions and chat completions (whole, or a
// server-sent event's chunk), token usage, and logprobs in the legacy
// completions shape and in the chat shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kolos/inference/sampler.h"
#include "kolos/tokenizer/tokenizer.h"
#include "serve_requests.h"

namespace kolos::cli::serve {

std::string error_body(const ApiError& e);

json completion_chunk(const std::string& id, const std::string& model, const std::string& text,
                      const std::vector<int64_t>& tokens, const std::string& reason,
                      const json& logprobs = nullptr);

json chat_chunk(const std::string& id, const std::string& model, const json& delta,
                const std::vector<int64_t>& tokens, const json& logprobs,
                const std::string& reason);

json chat_response(const std::string& id, const std::string& model, const std::string& text,
                   const std::vector<int64_t>& tokens, const json& logprobs,
                   const std::string& reason);

json usage_of(const Job& job);

// OpenAI's legacy completions shape; `offset` (bytes of the pieces before
// these tokens) advances.
json legacy_logprobs(const tokenizer::Tokenizer* tok,
                     const std::vector<inference::TokenLogprob>& lps, size_t& offset);

// OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs}]}.
json chat_logprobs(const tokenizer::Tokenizer* tok,
                   const std::vector<inference::TokenLogprob>& lps);

}  // namespace kolos::cli::serve
