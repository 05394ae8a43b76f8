// `kolos serve`'s requests: a generation request as it passes from its HTTP
// handler thread to the engine loop and back (Job), and the 4xx error a
// request is answered with (ApiError). The JSON bodies are parsed and
// checked into them by Server (serve_server.h, launchers/serve_requests.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kolos/inference/sampler.h"

namespace kolos::cli::serve {

using json = nlohmann::json;

// A 4xx answer in OpenAI's shape.
struct ApiError {
  int status = 400;
  std::string message, param, type = "invalid_request_error", code;
};

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

}  // namespace kolos::cli::serve
